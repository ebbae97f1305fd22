package stack

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/servers"
	"sigs.k8s.io/yaml"

	"github.com/virtfleet/virtfleet/agent/driver/nova"
	"github.com/virtfleet/virtfleet/internal/harness/openstack"
)

// cloudName is the clouds.yaml entry the nova node's agent uses.
const cloudName = "virtfleet-test"

// novaPollInterval is shorter than the agent's default so that what the
// scenarios change in Nova shows soon, but not so short that the polls
// are most of what the cloud does: each is a changes-since list that
// costs Nova's API more than anything else a test does as often. A guest
// in transition does not wait for it: the agent's reconciler re-examines
// it every second, and the driver reads a transitional server itself.
const novaPollInterval = "2s"

// novaBackend is a nova node's cloud: the test binary's shared real
// OpenStack (started at the first nova node, stopped by openstack.Main),
// fronted by the node's agent. Nodes share it as agents of one cloud do:
// each sees only the servers whose metadata names its node.
type novaBackend struct {
	cloud  *openstack.Cloud
	node   string
	clouds string
}

// cloudsFile is the part of a clouds.yaml the agent reads.
type cloudsFile struct {
	Clouds map[string]cloudEntry `json:"clouds"`
}

type cloudEntry struct {
	Auth       cloudAuth `json:"auth"`
	RegionName string    `json:"region_name"`
	Interface  string    `json:"interface"`
}

type cloudAuth struct {
	AuthURL           string `json:"auth_url"`
	Username          string `json:"username"`
	Password          string `json:"password"`
	ProjectName       string `json:"project_name"`
	UserDomainName    string `json:"user_domain_name"`
	ProjectDomainName string `json:"project_domain_name"`
}

// startNova joins node to the shared cloud and writes the clouds.yaml
// (0600) its agent reads into dir.
func startNova(ctx context.Context, node, dir string) (Backend, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, errors.Wrap(err, "cannot create the backend directory")
	}
	c, err := openstack.Shared(ctx)
	if err != nil {
		return nil, errors.Wrapf(err, "node %s", node)
	}
	y, err := yaml.Marshal(cloudsFile{Clouds: map[string]cloudEntry{cloudName: {
		Auth: cloudAuth{
			AuthURL: c.AuthURL(), Username: c.Username, Password: c.Password, ProjectName: c.Project,
			UserDomainName: c.Domain, ProjectDomainName: c.Domain,
		},
		RegionName: c.Region,
		Interface:  "public",
	}}})
	if err != nil {
		return nil, errors.Wrap(err, "cannot marshal clouds.yaml")
	}
	path := filepath.Join(dir, "clouds.yaml")
	if err := os.WriteFile(path, y, 0o600); err != nil {
		return nil, errors.Wrap(err, "cannot write clouds.yaml")
	}
	return &novaBackend{cloud: c, node: node, clouds: path}, nil
}

func (b *novaBackend) AgentArgs() []string {
	return []string{
		"--openstack-clouds-file=" + b.clouds,
		"--openstack-cloud=" + cloudName,
		"--nova-poll-interval=" + novaPollInterval,
	}
}

// Guests counts the node's servers by their virtfleet uid metadata, listed
// as the cloud's admin, not through the driver.
func (b *novaBackend) Guests(ctx context.Context) (map[string]int, error) {
	cl, err := b.cloud.Clients(ctx)
	if err != nil {
		return nil, err
	}
	page, err := servers.List(cl.Compute, servers.ListOpts{AllTenants: true}).AllPages(ctx)
	if err != nil {
		return nil, errors.Wrap(err, "cannot list servers")
	}
	all, err := servers.ExtractServers(page)
	if err != nil {
		return nil, errors.Wrap(err, "cannot read servers")
	}
	out := map[string]int{}
	for _, s := range all {
		if uid := s.Metadata[nova.MetaUID]; uid != "" && s.Metadata[nova.MetaNode] == b.node {
			out[uid]++
		}
	}
	return out, nil
}

func (b *novaBackend) String() string {
	return fmt.Sprintf("OpenStack (Debian's services) at %s, compute host %s, clouds.yaml %s", b.cloud.AuthURL(), b.cloud.ComputeHost, b.clouds)
}

// Stop leaves the shared cloud running: the test binary's openstack.Main
// stops it after the last test.
func (b *novaBackend) Stop() {}
