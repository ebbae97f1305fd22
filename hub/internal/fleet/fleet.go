// Package fleet is the hub's in-memory view of the nodes behind one NATS
// server: the latest report of every guest and the latest heartbeat of every
// node, kept current by the bus's watches. Reconcilers read it without waiting
// on the network, and it tells them at once when a report or a node changes,
// so status never waits for a poll interval.
//
// A node speaks only for itself. Reports are kept per node and uid, and a
// reconciler reads the report of the node its resource is placed on (the
// node recorded on the resource), never "the" report of a uid: a report
// another node wrote about the same uid can neither change what a user sees
// nor hasten or hold up a deletion. Reconcilers hand the resource to
// FlagForeign, which counts, logs and shows as a Warning event every report
// about it from a node it is not placed on. A report whose uid belongs to
// nothing placed on its node is kept and never read.
package fleet

import (
	"context"
	"net/netip"
	"reflect"
	"sort"
	"sync"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/event"
	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"

	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/bus"
	"github.com/virtfleet/virtfleet/hub/internal/placement"
	"github.com/virtfleet/virtfleet/internal/natswire"
)

// NodeStatus is what the hub knows of one node.
type NodeStatus struct {
	Heartbeat wire.NodeHeartbeat
	// LastSeen is when the hub last received the node's heartbeat.
	LastSeen time.Time
	// Lost is set when the heartbeat expired; LostSince says when.
	Lost      bool
	LostSince time.Time
}

// Report is a guest's latest report and when the hub received it.
type Report struct {
	bus.ReportEvent
	// ReceivedAt is the hub's time of receipt, comparable with
	// NodeStatus.LastSeen: a heartbeat seen after it counts the guest.
	ReceivedAt time.Time
}

// Fleet is the view of one NATS server's buckets.
type Fleet struct {
	// Bus publishes intents to the nodes.
	Bus bus.Bus

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

	mu sync.RWMutex
	// Every kind of report is kept by uid, then by the node that wrote it.
	reports map[string]map[string]Report
	// reportsSynced is set once the reports that existed when the watch
	// began are all in reports.
	reportsSynced bool
	// orphans are the keys of the reports in reports that carry an
	// orphan, so Orphan, which the placement loop asks for every VM it
	// places, reads them and not every report.
	orphans       map[reportKey]struct{}
	volumeReports map[string]map[string]VolumeReport
	imageReports  map[string]map[string]ImageReport
	// foreign are the reports already flagged by FlagForeign, so each is
	// flagged once per revision, and the deletions of flagged reports,
	// flagged at the next FlagForeign.
	foreign    map[claim]foreignState
	nodes      map[string]NodeStatus
	subs       []func(uid string)
	volumeSubs []func(uid string)
	imageSubs  []func(uid string)
	nodeSubs   []func(node string)
	// shownSubs hear of every change of what NodeStatuses shows.
	shownSubs []func(node string)
	syncSubs  []func()
}

// VolumeReport is a Volume's latest report and when the hub received it.
type VolumeReport struct {
	bus.VolumeReportEvent
	ReceivedAt time.Time
}

// ImageReport is an image's latest report from one node and when the hub
// received it.
type ImageReport struct {
	bus.ImageReportEvent
	ReceivedAt time.Time
}

// New returns a view over b. Call Run to fill it.
func New(b bus.Bus, log logging.Logger) *Fleet {
	return &Fleet{
		Bus:           b,
		log:           log,
		recorder:      event.NewNopRecorder(),
		now:           time.Now,
		started:       time.Now(),
		unknownAfter:  natswire.DefaultNodeTTL,
		reports:       map[string]map[string]Report{},
		orphans:       map[reportKey]struct{}{},
		volumeReports: map[string]map[string]VolumeReport{},
		imageReports:  map[string]map[string]ImageReport{},
		foreign:       map[claim]foreignState{},
		nodes:         map[string]NodeStatus{},
	}
}

// WithRecorder makes r show foreign reports as Warning events.
func (f *Fleet) WithRecorder(r event.Recorder) *Fleet {
	f.recorder = r
	return f
}

// Subscribe registers fn to be called with the uid of every guest whose
// report changed or whose node was lost or came back. fn must not block.
func (f *Fleet) Subscribe(fn func(uid string)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.subs = append(f.subs, fn)
}

// SubscribeVolumes registers fn to be called with the uid of every Volume
// whose report changed. fn must not block.
func (f *Fleet) SubscribeVolumes(fn func(uid string)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.volumeSubs = append(f.volumeSubs, fn)
}

// SubscribeImages registers fn to be called with the uid of every image
// whose report from any node changed. fn must not block.
func (f *Fleet) SubscribeImages(fn func(uid string)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.imageSubs = append(f.imageSubs, fn)
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
	wg.Add(2)
	go func() {
		defer wg.Done()
		if err := f.Bus.WatchReports(ctx, f.onReport); err != nil && ctx.Err() == nil {
			f.log.Info("Report watch ended", "error", err)
		}
	}()
	go func() {
		defer wg.Done()
		if err := f.Bus.WatchNodes(ctx, f.onNode); err != nil && ctx.Err() == nil {
			f.log.Info("Node watch ended", "error", err)
		}
	}()
	wg.Wait()
}

func (f *Fleet) onReport(e bus.ReportEvent) {
	if e.Volume != nil {
		f.onVolumeReport(*e.Volume)
		return
	}
	if e.Image != nil {
		f.onImageReport(*e.Image)
		return
	}
	if e.Synced {
		f.mu.Lock()
		f.reportsSynced = true
		subs := f.syncSubs
		f.mu.Unlock()
		for _, fn := range subs {
			fn()
		}
		return
	}
	f.mu.Lock()
	store(f, f.reports, KindVM, e.Node, e.UID, e.Deleted, Report{ReportEvent: e, ReceivedAt: f.now()})
	if k := (reportKey{uid: e.UID, node: e.Node}); !e.Deleted && e.Report.Orphan != nil {
		f.orphans[k] = struct{}{}
	} else {
		delete(f.orphans, k)
	}
	subs := f.subs
	f.mu.Unlock()
	for _, fn := range subs {
		fn(e.UID)
	}
}

func (f *Fleet) onVolumeReport(e bus.VolumeReportEvent) {
	f.mu.Lock()
	store(f, f.volumeReports, KindVolume, e.Node, e.UID, e.Deleted, VolumeReport{VolumeReportEvent: e, ReceivedAt: f.now()})
	subs := f.volumeSubs
	f.mu.Unlock()
	for _, fn := range subs {
		fn(e.UID)
	}
}

// onImageReport keeps the report whatever the node's liveness: a lost node
// still holds its images, and its guests are not started elsewhere either.
func (f *Fleet) onImageReport(e bus.ImageReportEvent) {
	f.mu.Lock()
	store(f, f.imageReports, KindImage, e.Node, e.UID, e.Deleted, ImageReport{ImageReportEvent: e, ReceivedAt: f.now()})
	subs := f.imageSubs
	f.mu.Unlock()
	for _, fn := range subs {
		fn(e.UID)
	}
}

// store keeps r as node's report of uid, or forgets it when deleted. The
// deletion of a report already flagged as foreign is remembered for
// FlagForeign; any other deletion of a report the hub never held says
// nothing and is not remembered (a node may delete its own keys at will).
// f.mu must be held.
func store[R any](f *Fleet, m map[string]map[string]R, kind ReportKind, node, uid string, deleted bool, r R) {
	c := claim{kind: kind, uid: uid, node: node}
	byNode := m[uid]
	if deleted {
		if _, held := byNode[node]; held {
			if st, flagged := f.foreign[c]; flagged && !st.deleted {
				f.foreign[c] = foreignState{deleted: true}
			}
		}
		delete(byNode, node)
		if len(byNode) == 0 {
			delete(m, uid)
		}
		return
	}
	if byNode == nil {
		byNode = map[string]R{}
		m[uid] = byNode
	}
	byNode[node] = r
	// A new revision is flagged anew.
	delete(f.foreign, c)
}

func (f *Fleet) onNode(e bus.NodeEvent) {
	now := f.now()
	f.mu.Lock()
	prev, known := f.nodes[e.Node]
	s := NodeStatus{Heartbeat: e.Heartbeat, LastSeen: now}
	if e.Lost {
		s = prev
		if !prev.Lost {
			s.Lost, s.LostSince = true, now
		}
	}
	f.nodes[e.Node] = s
	// Guests care only when the node's liveness flips.
	var affected []string
	if !known || prev.Lost != s.Lost {
		for uid, byNode := range f.reports {
			if _, ok := byNode[e.Node]; ok {
				affected = append(affected, uid)
			}
		}
	}
	subs, nodeSubs, shownSubs := f.subs, f.nodeSubs, f.shownSubs
	f.mu.Unlock()
	if !known || prev.Lost != s.Lost || !sameContent(prev.Heartbeat, s.Heartbeat) {
		for _, fn := range shownSubs {
			fn(e.Node)
		}
	}
	switch {
	case s.Lost && known && !prev.Lost:
		f.log.Info("Node lost: its heartbeat expired; its VMs show Unknown until it is back", "node", e.Node, "lastHeartbeat", prev.LastSeen.UTC().Format(time.RFC3339), "vms", len(affected))
	case !s.Lost && known && prev.Lost:
		f.log.Info("Node back: its heartbeats arrive again", "node", e.Node, "lostFor", now.Sub(prev.LostSince).Round(time.Second).String())
	case !known && !s.Lost:
		f.log.Info("Node joined", "node", e.Node, "backend", s.Heartbeat.Backend, "agentVersion", s.Heartbeat.AgentVersion)
	}
	for _, uid := range affected {
		for _, fn := range subs {
			fn(uid)
		}
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

// Report returns node's latest report of guest uid. Pass the node the guest
// is placed on: what another node says of it is not its state.
func (f *Fleet) Report(node, uid string) (Report, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	r, ok := f.reports[uid][node]
	return r, ok
}

// VolumeReport returns node's latest report of Volume uid. Pass the node
// the Volume is bound to.
func (f *Fleet) VolumeReport(node, uid string) (VolumeReport, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	r, ok := f.volumeReports[uid][node]
	return r, ok
}

// VolumeReports returns every node's report of Volume uid, sorted by node:
// for cleaning up after a Volume that no longer exists, when no node is
// recorded anywhere.
func (f *Fleet) VolumeReports(uid string) []VolumeReport {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return sorted(f.volumeReports[uid], func(r VolumeReport) string { return r.Node })
}

// ImageReports returns the latest report of image uid from each of nodes
// that has one, sorted by node: the nodes the image is placed on. A node
// with no report does not have the image.
func (f *Fleet) ImageReports(uid string, nodes ...string) []ImageReport {
	f.mu.RLock()
	defer f.mu.RUnlock()
	byNode := f.imageReports[uid]
	out := make([]ImageReport, 0, len(nodes))
	for _, n := range nodes {
		if r, ok := byNode[n]; ok {
			out = append(out, r)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Node < out[j].Node })
	return out
}

// ImageReporters returns the nodes that report image uid, sorted.
func (f *Fleet) ImageReporters(uid string) []string {
	f.mu.RLock()
	defer f.mu.RUnlock()
	out := make([]string, 0, len(f.imageReports[uid]))
	for n := range f.imageReports[uid] {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

func sorted[R any](byNode map[string]R, node func(R) string) []R {
	out := make([]R, 0, len(byNode))
	for _, r := range byNode {
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return node(out[i]) < node(out[j]) })
	return out
}

// Node returns what is known of node. A node the hub has never heard from
// counts as lost once the hub has watched long enough to have heard from
// every live node.
func (f *Fleet) Node(name string) NodeStatus {
	if s, ok := f.Heard(name); ok {
		return s
	}
	if f.now().Sub(f.started) > f.unknownAfter {
		return NodeStatus{Lost: true, LostSince: f.started.Add(f.unknownAfter)}
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
		hb := s.Heartbeat
		out = append(out, placement.Node{
			Name:      name,
			Backend:   hb.Backend,
			Labels:    hb.Labels,
			Capacity:  placement.Resources{VCPU: hb.Capacity.VCPU, MemoryBytes: hb.Capacity.MemoryBytes},
			Allocated: placement.Resources{VCPU: hb.Allocated.VCPU, MemoryBytes: hb.Allocated.MemoryBytes},
			LastSeen:  s.LastSeen,
		})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
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
