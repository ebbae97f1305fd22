package stack

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"sigs.k8s.io/yaml"

	"github.com/virtfleet/virtfleet/agent/driver/nova"
	"github.com/virtfleet/virtfleet/internal/testing/openstacktest"
)

// cloudName is the clouds.yaml entry the nova node's agent uses.
const cloudName = "virtfleet-test"

// novaPollInterval is short so the hub scenarios' waits stay short.
const novaPollInterval = "500ms"

// novaBackend is an OpenStack API test server in this process, fronted by
// one nova agent.
type novaBackend struct {
	server *openstacktest.Server
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

// startNova starts an OpenStack API test server for node with one compute
// host, <node>-compute-1, and writes the clouds.yaml (0600) its agent reads
// into dir.
func startNova(_ context.Context, node, dir string) (Backend, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, errors.Wrap(err, "cannot create the backend directory")
	}
	var secret [16]byte
	_, _ = rand.Read(secret[:])
	s, err := openstacktest.Start(openstacktest.Options{
		Password: hex.EncodeToString(secret[:]),
		Hosts:    []string{node + "-compute-1"},
	})
	if err != nil {
		return nil, err
	}
	o := s.Options()
	y, err := yaml.Marshal(cloudsFile{Clouds: map[string]cloudEntry{cloudName: {
		Auth: cloudAuth{
			AuthURL: s.AuthURL(), Username: o.Username, Password: o.Password, ProjectName: o.Project,
			UserDomainName: o.Domain, ProjectDomainName: o.Domain,
		},
		RegionName: o.Region,
		Interface:  "public",
	}}})
	if err != nil {
		s.Close()
		return nil, errors.Wrap(err, "cannot marshal clouds.yaml")
	}
	path := filepath.Join(dir, "clouds.yaml")
	if err := os.WriteFile(path, y, 0o600); err != nil {
		s.Close()
		return nil, errors.Wrap(err, "cannot write clouds.yaml")
	}
	return &novaBackend{server: s, clouds: path}, nil
}

func (b *novaBackend) AgentArgs() []string {
	return []string{
		"--openstack-clouds-file=" + b.clouds,
		"--openstack-cloud=" + cloudName,
		"--nova-poll-interval=" + novaPollInterval,
	}
}

// Guests counts the servers by their virtfleet uid metadata, read from the
// test server's state.
func (b *novaBackend) Guests(context.Context) (map[string]int, error) {
	out := map[string]int{}
	for _, s := range b.server.Servers() {
		if uid := s.Metadata[nova.MetaUID]; uid != "" {
			out[uid]++
		}
	}
	return out, nil
}

func (b *novaBackend) String() string {
	return b.server.URL() + " (OpenStack API, clouds.yaml " + b.clouds + ")"
}

func (b *novaBackend) Stop() { b.server.Close() }
