package stack

import (
	"context"
	"maps"
	"slices"
	"sync"
	"time"
)

// sampleEvery is how long a Sampler waits between two samples.
const sampleEvery = 50 * time.Millisecond

// A Sampler reads some nodes' running guests from their libvirtds, behind
// virtfleet's back, as fast as it can, to catch a VM running on two nodes
// at once: each sample reads every node once, and a VM seen running on
// more than one node in one sample ran twice. It also remembers when each
// VM was first and last seen running on each node. A node whose libvirtd
// does not answer (killed) runs nothing.
type Sampler struct {
	s      *Stack
	nodes  []string
	o      SamplerOptions
	cancel context.CancelFunc
	done   chan struct{}

	mu sync.Mutex
	n  int
	// seen is, per VM and node, the first and last sample that showed it
	// running there.
	seen map[string]map[string][2]time.Time
	// double is, per VM, the first sample that showed it running on more
	// than one node.
	double map[string]Double
}

// SamplerOptions say what a Sampler counts a guest for.
type SamplerOptions struct {
	// VMOf names the VM a running guest (by its UUID) is of, and false
	// for a guest of no VM, which the sampler passes over. Nil counts
	// each guest as the VM of its UUID, as libvirt nodes name their
	// domains.
	VMOf func(guest string) (vm string, ok bool)
	// Learn, when set, runs before a sample at most once a second, on
	// the sampler's goroutine, as VMOf does: what it learns for VMOf
	// needs no lock.
	Learn func(ctx context.Context)
}

// Double is a VM seen running on more than one node in one sample.
type Double struct {
	// Nodes are those it ran on, in the Sampler's order.
	Nodes []string
	// At is when the sample began.
	At time.Time
}

// StartSampler samples nodes until ctx ends or Stop.
func (s *Stack) StartSampler(ctx context.Context, nodes []string, o SamplerOptions) *Sampler {
	ctx, cancel := context.WithCancel(ctx)
	sm := &Sampler{s: s, nodes: nodes, o: o, cancel: cancel, done: make(chan struct{}), seen: map[string]map[string][2]time.Time{}, double: map[string]Double{}}
	go sm.run(ctx)
	return sm
}

func (sm *Sampler) run(ctx context.Context) {
	defer close(sm.done)
	var learnt time.Time
	for ctx.Err() == nil {
		if sm.o.Learn != nil && time.Since(learnt) >= time.Second {
			sm.o.Learn(ctx)
			learnt = time.Now()
		}
		at := time.Now()
		where := map[string][]string{}
		for _, node := range sm.nodes {
			// A killed libvirtd runs nothing.
			running, err := sm.s.RunningGuests(ctx, node)
			if err != nil {
				continue
			}
			for guest := range running {
				vm, ok := guest, true
				if sm.o.VMOf != nil {
					vm, ok = sm.o.VMOf(guest)
				}
				if ok && !slices.Contains(where[vm], node) {
					where[vm] = append(where[vm], node)
				}
			}
		}
		sm.record(at, where)
		select {
		case <-ctx.Done():
		case <-time.After(sampleEvery):
		}
	}
}

// record remembers one sample, begun at at, of the nodes each VM ran on.
func (sm *Sampler) record(at time.Time, where map[string][]string) {
	sm.mu.Lock()
	defer sm.mu.Unlock()
	sm.n++
	for vm, nodes := range where {
		if _, seen := sm.double[vm]; len(nodes) > 1 && !seen {
			sm.double[vm] = Double{Nodes: nodes, At: at}
		}
		byNode := sm.seen[vm]
		if byNode == nil {
			byNode = map[string][2]time.Time{}
			sm.seen[vm] = byNode
		}
		for _, node := range nodes {
			w := byNode[node]
			if w[0].IsZero() {
				w[0] = at
			}
			w[1] = at
			byNode[node] = w
		}
	}
}

// Stop ends the sampling and waits for the sample under way; calling it
// again does nothing.
func (sm *Sampler) Stop() {
	sm.cancel()
	<-sm.done
}

// Samples is how many samples were taken.
func (sm *Sampler) Samples() int {
	sm.mu.Lock()
	defer sm.mu.Unlock()
	return sm.n
}

// Doubles are, per VM, the first sample that showed it running on more
// than one node.
func (sm *Sampler) Doubles() map[string]Double {
	sm.mu.Lock()
	defer sm.mu.Unlock()
	return maps.Clone(sm.double)
}

// FirstRunningElsewhere is the first sample after since that showed vm
// running on a node other than lost, or zero.
func (sm *Sampler) FirstRunningElsewhere(vm, lost string, since time.Time) time.Time {
	sm.mu.Lock()
	defer sm.mu.Unlock()
	var first time.Time
	for node, w := range sm.seen[vm] {
		if node != lost && w[0].After(since) && (first.IsZero() || w[0].Before(first)) {
			first = w[0]
		}
	}
	return first
}

// LastRunningOn is the last sample that showed vm running on node, or
// zero.
func (sm *Sampler) LastRunningOn(vm, node string) time.Time {
	sm.mu.Lock()
	defer sm.mu.Unlock()
	return sm.seen[vm][node][1]
}
