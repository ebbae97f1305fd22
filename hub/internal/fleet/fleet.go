// Package fleet is the hub's in-memory view of the nodes behind one NATS
// server: the latest report of every kind (guests, Volumes, images) and the
// latest heartbeat of every node, kept current by the bus's watches.
// Reconcilers read it without waiting on the network, and it tells them at
// once when a report or a node changes, so status never waits for a poll
// interval.
//
// Each kind of report has its view, a Reports made by Watch from the kind's
// declaration (wire.Kind); the report watch hands each entry to the view
// whose kind its key is of. A new kind of report is a new Watch, not a new
// branch here.
//
// A node speaks only for itself. Reports are kept per node and uid, and a
// reconciler reads the report of the node its resource is placed on (the
// node recorded on the resource), never "the" report of a uid: a report
// another node wrote about the same uid can neither change what a user sees
// nor hasten or hold up a deletion. Reconcilers hand the resource to its
// view's FlagForeign, which counts, logs and shows as a Warning event every
// report about it from a node it is not placed on. A report whose uid
// belongs to nothing placed on its node is kept and never read.
package fleet

import (
	"context"
	"errors"
	"net/netip"
	"reflect"
	"sort"
	"sync"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/event"
	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/bus"
	"github.com/virtfleet/virtfleet/hub/internal/placement"
	"github.com/virtfleet/virtfleet/internal/natswire"
)

// NodeStatus is what the hub knows of one node.
type NodeStatus struct {
	// Heartbeat is the node's latest heartbeat as far as it counts: what
	// its HypervisorNode allows of Claimed (Admit).
	Heartbeat wire.NodeHeartbeat
	// Claimed is the heartbeat as the node sent it, Refused what of it
	// does not count.
	Claimed wire.NodeHeartbeat
	Refused []Refusal
	// LastSeen is when the hub last received the node's heartbeat.
	LastSeen time.Time
	// Lost is set when the heartbeat expired; LostSince says when.
	Lost      bool
	LostSince time.Time
}

// Fleet is the view of one NATS server's buckets.
type Fleet struct {
	// Bus publishes intents to the nodes.
	Bus bus.Bus
	// Guests are the nodes' reports of their guests, by VM uid. Their
	// subscribers also hear of every guest whose node was lost or came
	// back.
	Guests *Reports[wire.Report]
	// Volumes are the nodes' reports of the Volumes bound to them.
	Volumes *Reports[wire.VolumeReport]
	// Images are the nodes' reports of the DiskImages they hold. A lost
	// node's reports stay: it still holds its images, and its guests are
	// not started elsewhere either.
	Images *Reports[wire.ImageReport]
	// Snapshots are the nodes' reports of the VirtualMachineSnapshots of
	// their guests. Like the guests', their subscribers also hear of every
	// snapshot whose node was lost or came back: a snapshot on a lost node
	// cannot be restored.
	Snapshots *Reports[wire.SnapshotReport]
	// Backups are the nodes' reports of the VirtualMachineBackups they
	// take; their subscribers hear of nodes lost and back too.
	Backups *Reports[wire.BackupReport]

	log     logging.Logger
	now     func() time.Time
	started time.Time
	// unknownAfter is how long after start a node never heard of counts as
	// lost: by then every live node has sent several heartbeats.
	unknownAfter time.Duration

	// recorder shows foreign reports as Warning events on the resource.
	recorder event.Recorder
	// sealKey signs the hub's placements (Seal).
	sealKey []byte
	// records are the hub's own records in the intents bucket: the VMs'
	// bindings (Held) and the Volumes' sizes in effect (SizeInEffect).
	records records
	// allowances bound what the nodes' heartbeats claim; nil applies
	// Admit with no administrator's word.
	allowances *Allowances
	// waiting is set while f waits for its allowances: no node can have
	// been heard yet, so none counts as lost.
	waiting bool

	// mu guards the fleet and its views.
	mu sync.RWMutex
	// views are the kinds of report the report watch hands entries to.
	views []view
	// reportsSynced is set once the reports that existed when the watch
	// began are all in the views.
	reportsSynced bool
	nodes         map[string]NodeStatus
	nodeSubs      []func(node string)
	// shownSubs hear of every change of what NodeStatuses shows.
	shownSubs []func(node string)
	syncSubs  []func()
}

// New returns a view over b. Call Run to fill it.
func New(b bus.Bus, log logging.Logger) *Fleet {
	f := &Fleet{
		Bus:          b,
		log:          log,
		recorder:     event.NewNopRecorder(),
		now:          time.Now,
		started:      time.Now(),
		unknownAfter: natswire.DefaultNodeTTL,
		nodes:        map[string]NodeStatus{},
	}
	f.Guests = Watch(f, wire.GuestReports, v1alpha1.VirtualMachineKind)
	// The placement loop asks Orphan for every VM it places: it reads the
	// orphans' reports, not every report.
	f.Guests.index = func(r wire.Report) bool { return r.Orphan != nil }
	f.Guests.followsNodes = true
	f.Volumes = Watch(f, wire.VolumeReports, v1alpha1.VolumeKind)
	f.Images = Watch(f, wire.ImageReports, v1alpha1.DiskImageKind)
	f.Snapshots = Watch(f, wire.SnapshotReports, v1alpha1.VirtualMachineSnapshotKind)
	f.Snapshots.followsNodes = true
	f.Backups = Watch(f, wire.BackupReports, v1alpha1.VirtualMachineBackupKind)
	f.Backups.followsNodes = true
	return f
}

// WithRecorder makes r show foreign reports as Warning events.
func (f *Fleet) WithRecorder(r event.Recorder) *Fleet {
	f.recorder = r
	return f
}

// SubscribeNodes registers fn to be called with the name of every node that
// joins, comes back (from lost, or from heartbeats late enough for
// placement to pass it over), or has more room than at its previous heartbeat (a
// guest went, or the node grew): guests waiting for room may fit now. fn
// must not block.
func (f *Fleet) SubscribeNodes(fn func(node string)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nodeSubs = append(f.nodeSubs, fn)
}

// SubscribeNodeChanges registers fn to be called with the name of every
// node whose liveness or heartbeat content (backend, versions, labels,
// capacity, allocation) changed; not for a heartbeat that only says the
// same again. fn must not block.
func (f *Fleet) SubscribeNodeChanges(fn func(node string)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.shownSubs = append(f.shownSubs, fn)
}

// SubscribeSynced registers fn to be called each time the report watch has
// caught up with the server: once the reports present at the start are read
// (Orphan answers from then on), and again whenever the watch resumes after
// the connection to the NATS server was lost and came back. fn must not
// block.
func (f *Fleet) SubscribeSynced(fn func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.syncSubs = append(f.syncSubs, fn)
}

// Run keeps the view current until ctx is done.
func (f *Fleet) Run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := f.Bus.Watch(ctx, wire.BucketReports, f.onReport); err != nil && ctx.Err() == nil {
			f.log.Info("Report watch ended", "error", err)
		}
	})
	wg.Go(func() {
		// The watch hands back every intent the hub writes as well; the
		// hub's records share the bucket so that nothing but the hub can
		// write them (see wire.BindingRecord, wire.VolumeSizeRecord).
		if err := f.Bus.Watch(ctx, wire.BucketIntents, f.onIntent); err != nil && ctx.Err() == nil {
			f.log.Info("Record watch ended", "error", err)
		}
	})
	wg.Go(func() {
		if !f.awaitAllowances(ctx) {
			return
		}
		if err := f.Bus.WatchNodes(ctx, f.onNode); err != nil && ctx.Err() == nil {
			f.log.Info("Node watch ended", "error", err)
		}
	})
	wg.Wait()
}

// onReport hands an entry of the reports bucket to the view whose kind its
// key is of. A key of no kind the fleet watches is refused: nothing but
// reports may be written there.
func (f *Fleet) onReport(e bus.Entry) error {
	if e.Synced {
		f.mu.Lock()
		f.reportsSynced = true
		subs := f.syncSubs
		f.mu.Unlock()
		for _, fn := range subs {
			fn()
		}
		return nil
	}
	node, rest, err := wire.ParseKey(e.Key)
	if err != nil {
		return err
	}
	f.mu.RLock()
	views := f.views
	f.mu.RUnlock()
	for _, v := range views {
		if uid, ok := v.uid(rest); ok {
			return v.apply(e, node, uid)
		}
	}
	return &wire.KeyError{What: "key", Value: e.Key, Reason: "not the key of a kind of report"}
}

func (f *Fleet) onNode(e bus.NodeEvent) {
	now := f.now()
	f.mu.Lock()
	prev, known := f.nodes[e.Node]
	s := NodeStatus{Claimed: e.Heartbeat, LastSeen: now}
	s.Heartbeat, s.Refused = f.admit(e.Node, e.Heartbeat)
	if e.Lost {
		s = prev
		if !prev.Lost {
			s.Lost, s.LostSince = true, now
		}
	}
	f.nodes[e.Node] = s
	// Guests and snapshots care only when the node's liveness flips.
	var affected []func()
	vms := 0
	if !known || prev.Lost != s.Lost {
		vms = len(f.Guests.uidsOn(e.Node))
		for _, v := range f.views {
			if fn := v.nodeFlipped(e.Node); fn != nil {
				affected = append(affected, fn)
			}
		}
	}
	nodeSubs, shownSubs := f.nodeSubs, f.shownSubs
	f.mu.Unlock()
	countRefusals(prev.Refused, s.Refused)
	if !known || prev.Lost != s.Lost || !sameContent(prev.Claimed, s.Claimed) {
		for _, fn := range shownSubs {
			fn(e.Node)
		}
	}
	switch {
	case s.Lost && known && !prev.Lost:
		f.log.Info("Node lost: its heartbeat expired; its VMs show Unknown until it is back", "node", e.Node, "lastHeartbeat", prev.LastSeen.UTC().Format(time.RFC3339), "vms", vms)
	case !s.Lost && known && prev.Lost:
		f.log.Info("Node back: its heartbeats arrive again", "node", e.Node, "lostFor", now.Sub(prev.LostSince).Round(time.Second).String())
	case !known && !s.Lost:
		f.log.Info("Node joined", "node", e.Node, "backend", s.Heartbeat.Backend, "agentVersion", s.Heartbeat.AgentVersion)
	}
	for _, notify := range affected {
		notify()
	}
	// A node whose heartbeats were late enough for placement to pass it
	// over counts as back.
	late := known && now.Sub(prev.LastSeen) > placement.DefaultStaleAfter
	if joined := !s.Lost && (!known || prev.Lost || late); joined || (!s.Lost && roomGrew(prev.Heartbeat, s.Heartbeat)) {
		for _, fn := range nodeSubs {
			fn(e.Node)
		}
	}
}

// sameContent is whether two heartbeats say the same of their node, apart
// from when they were sent.
func sameContent(a, b wire.NodeHeartbeat) bool {
	a.SentAt, b.SentAt = time.Time{}, time.Time{}
	return reflect.DeepEqual(a, b)
}

// roomGrew is whether the node's free vCPUs or memory grew from one
// heartbeat to the next.
func roomGrew(prev, cur wire.NodeHeartbeat) bool {
	free := func(h wire.NodeHeartbeat) (int64, int64) {
		return h.Capacity.VCPU - h.Allocated.VCPU, h.Capacity.MemoryBytes - h.Allocated.MemoryBytes
	}
	pc, pm := free(prev)
	cc, cm := free(cur)
	return cc > pc || cm > pm
}

// Node returns what is known of node. A node the hub has never heard from
// counts as lost once the hub has watched long enough to have heard from
// every live node.
func (f *Fleet) Node(name string) NodeStatus {
	if s, ok := f.Heard(name); ok {
		return s
	}
	f.mu.RLock()
	started, waiting := f.started, f.waiting
	f.mu.RUnlock()
	if f.now().Sub(started) > f.unknownAfter && !waiting {
		return NodeStatus{Lost: true, LostSince: started.Add(f.unknownAfter)}
	}
	return NodeStatus{}
}

// Nodes returns the live nodes for placement, sorted by name.
func (f *Fleet) Nodes() []placement.Node {
	f.mu.RLock()
	defer f.mu.RUnlock()
	out := make([]placement.Node, 0, len(f.nodes))
	for name, s := range f.nodes {
		if s.Lost {
			continue
		}
		out = append(out, placementNode(name, s))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Placeable is the live node name as Nodes lists it, and false when it has
// sent no heartbeat since the hub started or is lost.
func (f *Fleet) Placeable(name string) (placement.Node, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	s, ok := f.nodes[name]
	if !ok || s.Lost {
		return placement.Node{}, false
	}
	return placementNode(name, s), true
}

// placementNode is what placement knows of node name from s.
func placementNode(name string, s NodeStatus) placement.Node {
	hb := s.Heartbeat
	return placement.Node{
		Name:        name,
		Backend:     hb.Backend,
		Labels:      hb.Labels,
		Capacity:    placement.Resources{VCPU: hb.Capacity.VCPU, MemoryBytes: hb.Capacity.MemoryBytes},
		Allocated:   placement.Resources{VCPU: hb.Allocated.VCPU, MemoryBytes: hb.Allocated.MemoryBytes},
		LastSeen:    s.LastSeen,
		SharedPools: hb.SharedPools,
	}
}

// Heard returns what is known of node, and whether it has sent a
// heartbeat since the hub started (Node says what a node never heard of
// counts as).
func (f *Fleet) Heard(name string) (NodeStatus, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	s, ok := f.nodes[name]
	return s, ok
}

// NodeStatuses returns what is known of every node that has sent a
// heartbeat since the hub started, lost ones included, by name.
func (f *Fleet) NodeStatuses() map[string]NodeStatus {
	f.mu.RLock()
	defer f.mu.RUnlock()
	out := make(map[string]NodeStatus, len(f.nodes))
	for name, s := range f.nodes {
		out[name] = s
	}
	return out
}

// Tunnels are the tunnel addresses the live nodes announce, by node; a node
// without one, or with one that is no address, is left out.
func (f *Fleet) Tunnels() map[string]netip.Addr {
	f.mu.RLock()
	defer f.mu.RUnlock()
	out := make(map[string]netip.Addr, len(f.nodes))
	for name, s := range f.nodes {
		if a, err := netip.ParseAddr(s.Heartbeat.TunnelAddress); err == nil && !s.Lost {
			out[name] = a
		}
	}
	return out
}

// HearingFrom is the fleet of fleets that hears from node, for an object
// whose own ProviderConfig no longer names one (its VM is gone). Of a
// node no fleet has heard from, the first fleet's view says whether it
// counts as lost.
func HearingFrom(fleets []*Fleet, node string) (*Fleet, error) {
	for _, f := range fleets {
		if _, ok := f.Heard(node); ok {
			return f, nil
		}
	}
	if len(fleets) == 0 {
		return nil, errors.New("the hub is connected to no NATS server yet")
	}
	return fleets[0], nil
}

// Forget drops what f knows of node's heartbeats, for a node removed for
// good: it is then one never heard from, and one heard from later joins
// as new.
func (f *Fleet) Forget(node string) {
	f.mu.Lock()
	delete(f.nodes, node)
	subs := f.shownSubs
	f.mu.Unlock()
	for _, fn := range subs {
		fn(node)
	}
}
