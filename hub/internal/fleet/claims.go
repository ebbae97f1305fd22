package fleet

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"net/url"
	"reflect"
	"slices"
	"strings"
	"sync"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/metrics"
)

// A node's heartbeat claims what steers the hub towards it: labels that
// nodeSelectors and placement groups match, shared storage pools, the
// address the other nodes' overlay sends frames to, the URI guests'
// memory is streamed to. Whoever holds the node's NATS credentials can
// claim anything, so what counts is what the node's HypervisorNode (an
// administrator's object) allows, as Kubernetes' NodeRestriction bounds
// what a kubelet may say of its Node: the fleet keeps the claim
// (NodeStatus.Claimed) and shows everyone else only what Admit lets
// through (NodeStatus.Heartbeat).

// Claims refused, by what was claimed (the Refusal's Claim, the label of
// metrics.NodeClaimsRefused).
const (
	ClaimLabel     = "label"
	ClaimPool      = "shared-pool"
	ClaimTunnel    = "tunnel-address"
	ClaimMigration = "migration-uri"
)

// A Refusal is one claim of a heartbeat the hub does not count.
type Refusal struct {
	// Claim is what kind of claim: ClaimLabel, ClaimPool, ClaimTunnel or
	// ClaimMigration.
	Claim string
	// Value is what was claimed, Reason why it does not count.
	Value, Reason string
}

func (r Refusal) String() string {
	return fmt.Sprintf("%s %s: %s", r.Claim, r.Value, r.Reason)
}

// Admit is what of hb counts under spec, the administrator's word on the
// node (nil when there is none), and the claims refused. The
// administrator's labels win; claimed labels under the reserved prefix,
// pools and addresses outside what spec.claims lists never count.
func Admit(spec *v1alpha1.HypervisorNodeSpec, hb wire.NodeHeartbeat) (wire.NodeHeartbeat, []Refusal) {
	if spec == nil {
		spec = &v1alpha1.HypervisorNodeSpec{}
	}
	var refused []Refusal
	hb.Labels, refused = admitLabels(spec.Labels, hb.Labels)
	claims := spec.Claims
	if claims == nil {
		claims = &v1alpha1.NodeClaims{}
	}
	if allowed := claims.SharedPools; allowed != nil {
		kept := make([]string, 0, len(hb.SharedPools))
		for _, p := range hb.SharedPools {
			if slices.Contains(*allowed, p) {
				kept = append(kept, p)
				continue
			}
			refused = append(refused, Refusal{Claim: ClaimPool, Value: p, Reason: "not in spec.claims.sharedPools"})
		}
		hb.SharedPools = kept
	}
	if cidrs := claims.TunnelCIDRs; cidrs != nil && hb.TunnelAddress != "" {
		if reason := outside(hb.TunnelAddress, *cidrs, "spec.claims.tunnelCIDRs"); reason != "" {
			refused = append(refused, Refusal{Claim: ClaimTunnel, Value: hb.TunnelAddress, Reason: reason})
			hb.TunnelAddress = ""
		}
	}
	if cidrs := claims.MigrationCIDRs; cidrs != nil && hb.MigrationURI != "" {
		reason := "its host is no address in spec.claims.migrationCIDRs"
		if u, err := url.Parse(hb.MigrationURI); err == nil {
			reason = outside(u.Hostname(), *cidrs, "spec.claims.migrationCIDRs")
		}
		if reason != "" {
			refused = append(refused, Refusal{Claim: ClaimMigration, Value: hb.MigrationURI, Reason: reason})
			hb.MigrationURI = ""
		}
	}
	return hb, refused
}

// admitLabels are the node's labels: the administrator's, and the claimed
// ones besides that are not reserved.
func admitLabels(admin, claimed map[string]string) (map[string]string, []Refusal) {
	if len(admin) == 0 && !slices.ContainsFunc(slices.Collect(maps.Keys(claimed)), reserved) {
		return claimed, nil
	}
	out := maps.Clone(admin)
	if out == nil {
		out = map[string]string{}
	}
	var refused []Refusal
	for _, k := range slices.Sorted(maps.Keys(claimed)) {
		v := claimed[k]
		switch own, set := admin[k]; {
		case reserved(k):
			refused = append(refused, Refusal{Claim: ClaimLabel, Value: k + "=" + v, Reason: "under " + v1alpha1.ReservedLabelPrefix + ", which only spec.labels sets"})
		case set && own != v:
			refused = append(refused, Refusal{Claim: ClaimLabel, Value: k + "=" + v, Reason: "spec.labels says " + k + "=" + own})
		case !set:
			out[k] = v
		}
	}
	return out, refused
}

func reserved(key string) bool { return strings.HasPrefix(key, v1alpha1.ReservedLabelPrefix) }

// outside is why addr is no address within cidrs (field names them), or ""
// when it is one. A CIDR that does not parse holds nothing.
func outside(addr string, cidrs []string, field string) string {
	a, err := netip.ParseAddr(addr)
	if err != nil {
		return "not an address, and " + field + " is set"
	}
	for _, c := range cidrs {
		if p, err := netip.ParsePrefix(c); err == nil && p.Contains(a.Unmap()) {
			return ""
		}
	}
	return "not within " + field
}

// Allowances are the administrators' word on each node (the specs of the
// HypervisorNodes), as the fleets apply it to heartbeats. One Allowances
// serves every fleet; the HypervisorNode informer keeps it.
type Allowances struct {
	mu     sync.RWMutex
	specs  map[string]*v1alpha1.HypervisorNodeSpec
	synced chan struct{}
	subs   []func(node string)
}

// NewAllowances returns Allowances that know no node yet: fleets given it
// wait for Synced before they read any heartbeat, so no claim counts for
// want of its node's spec.
func NewAllowances() *Allowances {
	return &Allowances{specs: map[string]*v1alpha1.HypervisorNodeSpec{}, synced: make(chan struct{})}
}

// Set records node's spec; nil forgets it (the HypervisorNode is gone).
func (a *Allowances) Set(node string, spec *v1alpha1.HypervisorNodeSpec) {
	a.mu.Lock()
	if spec == nil {
		delete(a.specs, node)
	} else {
		a.specs[node] = spec.DeepCopy()
	}
	subs := a.subs
	a.mu.Unlock()
	for _, fn := range subs {
		fn(node)
	}
}

// MarkSynced says every HypervisorNode that existed is Set.
func (a *Allowances) MarkSynced() {
	a.mu.Lock()
	defer a.mu.Unlock()
	select {
	case <-a.synced:
	default:
		close(a.synced)
	}
}

// Synced is closed once MarkSynced was called.
func (a *Allowances) Synced() <-chan struct{} { return a.synced }

func (a *Allowances) spec(node string) *v1alpha1.HypervisorNodeSpec {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return a.specs[node]
}

func (a *Allowances) subscribe(fn func(node string)) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.subs = append(a.subs, fn)
}

// countRefusals counts each refusal of now that was not one before.
func countRefusals(before, now []Refusal) {
	for _, r := range now {
		if !slices.Contains(before, r) {
			metrics.NodeClaimsRefused.WithLabelValues(r.Claim).Inc()
		}
	}
}

// WithAllowances makes f count of each node's heartbeat only what a
// bounds (Admit), and read no heartbeat before a is synced: until then a
// pinned node's claims would count.
func (f *Fleet) WithAllowances(a *Allowances) *Fleet {
	f.allowances = a
	f.waiting = true
	a.subscribe(f.reconsider)
	return f
}

// admit is what of node's heartbeat hb counts in f.
func (f *Fleet) admit(node string, hb wire.NodeHeartbeat) (wire.NodeHeartbeat, []Refusal) {
	var spec *v1alpha1.HypervisorNodeSpec
	if f.allowances != nil {
		spec = f.allowances.spec(node)
	}
	return Admit(spec, hb)
}

// awaitAllowances waits for f's allowances to be synced, and is whether
// they are (not when ctx ended first). A node is counted lost for want of
// heartbeats only from then on.
func (f *Fleet) awaitAllowances(ctx context.Context) bool {
	if f.allowances == nil {
		return true
	}
	select {
	case <-ctx.Done():
		return false
	case <-f.allowances.Synced():
	}
	f.mu.Lock()
	f.started, f.waiting = f.now(), false
	f.mu.Unlock()
	return true
}

// reconsider applies node's allowance, which changed, to its latest
// heartbeat, and tells the subscribers when what counts changed: a node
// that may now claim more may take VMs waiting for it.
func (f *Fleet) reconsider(node string) {
	f.mu.Lock()
	s, ok := f.nodes[node]
	if !ok {
		f.mu.Unlock()
		return
	}
	before, refusedBefore := s.Heartbeat, s.Refused
	s.Heartbeat, s.Refused = f.admit(node, s.Claimed)
	f.nodes[node] = s
	nodeSubs, shownSubs := f.nodeSubs, f.shownSubs
	f.mu.Unlock()
	countRefusals(refusedBefore, s.Refused)
	if reflect.DeepEqual(before, s.Heartbeat) && slices.Equal(refusedBefore, s.Refused) {
		return
	}
	for _, fn := range shownSubs {
		fn(node)
	}
	if !s.Lost {
		for _, fn := range nodeSubs {
			fn(node)
		}
	}
}
