// Package providerconfig reconciles ProviderConfigs and ClusterProviderConfigs
// (holding each while managed resources use it, as every Crossplane provider
// does) and resolves the one a managed resource names into the NATS server
// and defaults it stands for.
package providerconfig

import (
	"cmp"
	"context"
	"encoding/json"
	"net"
	"net/url"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/resource"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"

	apisv1alpha1 "github.com/virtfleet/virtfleet/apis/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/fleet"
	"github.com/virtfleet/virtfleet/hub/internal/tenancy"
)

// configKinds are the two kinds of ProviderConfig, each reconciled by a
// connector (SetupConnectors) and by a UsersReconciler (Setup).
var configKinds = []struct {
	kind, groupKind string
	new             func() resource.ProviderConfig
	spec            func(client.Object) apisv1alpha1.ProviderConfigSpec
}{
	{
		kind: apisv1alpha1.ProviderConfigKind, groupKind: apisv1alpha1.ProviderConfigGroupKind,
		new:  func() resource.ProviderConfig { return &apisv1alpha1.ProviderConfig{} },
		spec: func(o client.Object) apisv1alpha1.ProviderConfigSpec { return o.(*apisv1alpha1.ProviderConfig).Spec },
	},
	{
		kind: apisv1alpha1.ClusterProviderConfigKind, groupKind: apisv1alpha1.ClusterProviderConfigGroupKind,
		new: func() resource.ProviderConfig { return &apisv1alpha1.ClusterProviderConfig{} },
		spec: func(o client.Object) apisv1alpha1.ProviderConfigSpec {
			return o.(*apisv1alpha1.ClusterProviderConfig).Spec.ProviderConfigSpec
		},
	},
}

// Config is what a ProviderConfig stands for.
type Config struct {
	Target       fleet.Target
	NodeSelector map[string]string
}

// Resolver reads the ProviderConfig a managed resource names.
type Resolver struct {
	kube client.Client

	mu sync.Mutex
	// targets are the targets read lately, by the spec they were read
	// from; see targetTTL.
	targets map[string]readTarget
}

type readTarget struct {
	t  fleet.Target
	at time.Time
}

// targetTTL is how long a ProviderConfig's target, credentials included,
// is used without reading its Secret again. Secrets are not cached (see
// app), so each read is a request to the API server, and every reconcile
// of every VM and Volume reads it: without this, a burst would cost about
// as many GETs as the hub makes writes, and the placement loop's reads one
// after the other would hold it up. A rotated credential reaches the hub
// within targetTTL.
const targetTTL = 10 * time.Second

// NewResolver returns a Resolver.
func NewResolver(kube client.Client) *Resolver {
	return &Resolver{kube: kube, targets: map[string]readTarget{}}
}

// Resolve returns what mg's ProviderConfig says. That mg uses it is not
// recorded: the ProviderConfig's controller counts its users (see Users).
func (r *Resolver) Resolve(ctx context.Context, mg resource.ModernManaged) (Config, error) {
	ref := mg.GetProviderConfigReference()
	var spec apisv1alpha1.ProviderConfigSpec
	switch ref.Kind {
	case apisv1alpha1.ProviderConfigKind:
		pc := &apisv1alpha1.ProviderConfig{}
		if err := r.kube.Get(ctx, types.NamespacedName{Namespace: mg.GetNamespace(), Name: ref.Name}, pc); err != nil {
			return Config{}, errors.Wrapf(err, "cannot get ProviderConfig %s", ref.Name)
		}
		var err error
		if spec, err = Tenanted(ctx, r.kube, pc.Spec, pc.Namespace); err != nil {
			return Config{}, err
		}
	case apisv1alpha1.ClusterProviderConfigKind:
		cpc := &apisv1alpha1.ClusterProviderConfig{}
		if err := r.kube.Get(ctx, types.NamespacedName{Name: ref.Name}, cpc); err != nil {
			return Config{}, errors.Wrapf(err, "cannot get ClusterProviderConfig %s", ref.Name)
		}
		spec = cpc.Spec.ProviderConfigSpec
	default:
		return Config{}, errors.Errorf("providerConfigRef.kind %q is neither ProviderConfig nor ClusterProviderConfig", ref.Kind)
	}
	t, err := r.target(ctx, spec)
	if err != nil {
		return Config{}, err
	}
	if ref.Kind == apisv1alpha1.ProviderConfigKind {
		t.Namespace = mg.GetNamespace()
	}
	return Config{Target: t, NodeSelector: spec.NodeSelector}, nil
}

// GrantOf is what namespace may reach beyond its own, as every
// ClusterProviderConfig kube lists grants it.
func GrantOf(ctx context.Context, kube client.Reader, namespace string) (tenancy.Grant, error) {
	cpcs := &apisv1alpha1.ClusterProviderConfigList{}
	if err := kube.List(ctx, cpcs); err != nil {
		return tenancy.Grant{}, errors.Wrap(err, "cannot list ClusterProviderConfigs for the namespace's grants")
	}
	return tenancy.For(cpcs.Items, namespace), nil
}

// Tenanted is what the namespaced ProviderConfig spec of namespace may
// say: its credentials Secret in its own namespace (OwnSecret), and only
// NATS servers an administrator named, in a ClusterProviderConfig or in
// the namespace's grants (natsServers). namespace "" (a
// ClusterProviderConfig) leaves spec as it is.
func Tenanted(ctx context.Context, kube client.Reader, spec apisv1alpha1.ProviderConfigSpec, namespace string) (apisv1alpha1.ProviderConfigSpec, error) {
	spec, err := OwnSecret(spec, namespace)
	if err != nil || namespace == "" {
		return spec, err
	}
	cpcs := &apisv1alpha1.ClusterProviderConfigList{}
	if err := kube.List(ctx, cpcs); err != nil {
		return apisv1alpha1.ProviderConfigSpec{}, errors.Wrap(err, "cannot list ClusterProviderConfigs for the NATS servers a namespace may name")
	}
	var cluster []string
	for _, cpc := range cpcs.Items {
		cluster = append(cluster, NATSServers(cpc.Spec.NATSURL)...)
	}
	g := tenancy.For(cpcs.Items, namespace)
	for _, s := range NATSServers(spec.NATSURL) {
		if err := g.CheckNATSServer(s, cluster); err != nil {
			return apisv1alpha1.ProviderConfigSpec{}, err
		}
	}
	return spec, nil
}

// NATSServers are the servers of a ProviderConfig's natsURL (one or more
// URLs, comma separated) as host:port, lower case, with NATS's default
// port where a URL has none: how grants name them.
func NATSServers(urls string) []string {
	var out []string
	for _, raw := range strings.Split(urls, ",") {
		raw = strings.TrimSpace(raw)
		if raw == "" {
			continue
		}
		if !strings.Contains(raw, "://") {
			raw = "nats://" + raw
		}
		host, port := raw, ""
		if u, err := url.Parse(raw); err == nil {
			host, port = u.Hostname(), u.Port()
		}
		out = append(out, strings.ToLower(net.JoinHostPort(host, cmp.Or(port, natsDefaultPort))))
	}
	return out
}

// natsDefaultPort is the port a NATS URL without one means.
const natsDefaultPort = "4222"

// OwnSecret is spec with its credentials Secret in namespace, the
// namespaced ProviderConfig's own: a tenant who may write ProviderConfigs
// in its namespace must not make the hub read another namespace's Secret
// (the hub's own NATS credentials among them). A Secret reference without
// a namespace means the ProviderConfig's; namespace "" (a
// ClusterProviderConfig, written by an administrator) leaves spec as it is.
func OwnSecret(spec apisv1alpha1.ProviderConfigSpec, namespace string) (apisv1alpha1.ProviderConfigSpec, error) {
	ref := spec.Credentials.SecretRef
	if namespace == "" || ref == nil {
		return spec, nil
	}
	if ref.Namespace != "" && ref.Namespace != namespace {
		return apisv1alpha1.ProviderConfigSpec{}, errors.Errorf("spec.credentials.secretRef.namespace is %q: a ProviderConfig reads Secrets only in its own namespace %s (a ClusterProviderConfig may name any)", ref.Namespace, namespace)
	}
	own := *ref
	own.Namespace = namespace
	spec.Credentials.SecretRef = &own
	return spec, nil
}

// target is TargetOf spec, read again once targetTTL has passed.
func (r *Resolver) target(ctx context.Context, spec apisv1alpha1.ProviderConfigSpec) (fleet.Target, error) {
	b, err := json.Marshal(spec)
	if err != nil {
		return fleet.Target{}, errors.Wrap(err, "cannot key the ProviderConfig")
	}
	key := string(b)
	r.mu.Lock()
	c, ok := r.targets[key]
	r.mu.Unlock()
	if ok && time.Since(c.at) < targetTTL {
		return c.t, nil
	}
	t, err := TargetOf(ctx, r.kube, spec)
	if err != nil {
		return fleet.Target{}, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for k, c := range r.targets {
		if time.Since(c.at) >= targetTTL {
			delete(r.targets, k)
		}
	}
	r.targets[key] = readTarget{t: t, at: time.Now()}
	return t, nil
}

// TargetOf is the NATS server spec names, with the hub's credentials read
// from their Secret.
func TargetOf(ctx context.Context, kube client.Client, spec apisv1alpha1.ProviderConfigSpec) (fleet.Target, error) {
	t := fleet.Target{URL: spec.NATSURL, Replicas: spec.Replicas}
	if spec.Credentials.Source == xpv2.CredentialsSourceNone {
		return t, nil
	}
	seed, err := resource.CommonCredentialExtractor(ctx, spec.Credentials.Source, kube, spec.Credentials.CommonCredentialSelectors)
	if err != nil {
		return fleet.Target{}, errors.Wrap(err, "cannot read the hub's NATS credentials")
	}
	t.Seed = seed
	return t, nil
}
