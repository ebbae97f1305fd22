// Package fleet is the hub's in-memory view of the nodes behind one NATS
// server: the latest report of every guest and the latest heartbeat of every
// node, kept current by the bus's watches. Reconcilers read it without waiting
// on the network, and it tells them at once when a report or a node changes,
// so status never waits for a poll interval.
package fleet

import (
	"context"
	"sort"
	"sync"
	"time"

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

	mu            sync.RWMutex
	reports       map[string]Report       // by uid
	volumeReports map[string]VolumeReport // by Volume uid
	// imageReports are by image uid, then node: an image is on many nodes.
	imageReports map[string]map[string]ImageReport
	nodes        map[string]NodeStatus
	subs         []func(uid string)
	volumeSubs   []func(uid string)
	imageSubs    []func(uid string)
	nodeSubs     []func(node string)
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
		now:           time.Now,
		started:       time.Now(),
		unknownAfter:  natswire.DefaultNodeTTL,
		reports:       map[string]Report{},
		volumeReports: map[string]VolumeReport{},
		imageReports:  map[string]map[string]ImageReport{},
		nodes:         map[string]NodeStatus{},
	}
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
// joins or comes back: guests waiting for room may fit now. fn must not block.
func (f *Fleet) SubscribeNodes(fn func(node string)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nodeSubs = append(f.nodeSubs, fn)
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
	f.mu.Lock()
	if e.Deleted {
		delete(f.reports, e.UID)
	} else {
		f.reports[e.UID] = Report{ReportEvent: e, ReceivedAt: f.now()}
	}
	subs := f.subs
	f.mu.Unlock()
	for _, fn := range subs {
		fn(e.UID)
	}
}

func (f *Fleet) onVolumeReport(e bus.VolumeReportEvent) {
	f.mu.Lock()
	if e.Deleted {
		delete(f.volumeReports, e.UID)
	} else {
		f.volumeReports[e.UID] = VolumeReport{VolumeReportEvent: e, ReceivedAt: f.now()}
	}
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
	byNode := f.imageReports[e.UID]
	switch {
	case e.Deleted:
		delete(byNode, e.Node)
		if len(byNode) == 0 {
			delete(f.imageReports, e.UID)
		}
	case byNode == nil:
		f.imageReports[e.UID] = map[string]ImageReport{e.Node: {ImageReportEvent: e, ReceivedAt: f.now()}}
	default:
		byNode[e.Node] = ImageReport{ImageReportEvent: e, ReceivedAt: f.now()}
	}
	subs := f.imageSubs
	f.mu.Unlock()
	for _, fn := range subs {
		fn(e.UID)
	}
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
		for uid, r := range f.reports {
			if r.Node == e.Node {
				affected = append(affected, uid)
			}
		}
	}
	subs, nodeSubs := f.subs, f.nodeSubs
	f.mu.Unlock()
	for _, uid := range affected {
		for _, fn := range subs {
			fn(uid)
		}
	}
	if joined := !s.Lost && (!known || prev.Lost); joined {
		for _, fn := range nodeSubs {
			fn(e.Node)
		}
	}
}

// Report returns the latest report of guest uid and the node that wrote it.
func (f *Fleet) Report(uid string) (Report, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	r, ok := f.reports[uid]
	return r, ok
}

// VolumeReport returns the latest report of Volume uid and the node that
// wrote it.
func (f *Fleet) VolumeReport(uid string) (VolumeReport, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	r, ok := f.volumeReports[uid]
	return r, ok
}

// ImageReports returns the latest report of image uid from every node that
// has one, sorted by node. A node with no report does not have the image.
func (f *Fleet) ImageReports(uid string) []ImageReport {
	f.mu.RLock()
	defer f.mu.RUnlock()
	byNode := f.imageReports[uid]
	out := make([]ImageReport, 0, len(byNode))
	for _, r := range byNode {
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Node < out[j].Node })
	return out
}

// Node returns what is known of node. A node the hub has never heard from
// counts as lost once the hub has watched long enough to have heard from
// every live node.
func (f *Fleet) Node(name string) NodeStatus {
	f.mu.RLock()
	defer f.mu.RUnlock()
	if s, ok := f.nodes[name]; ok {
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
