package placement

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const gib = int64(1) << 30

var t0 = time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)

func node(name string, vcpu, memGiB, usedVCPU, usedGiB int64, mods ...func(*Node)) Node {
	n := Node{
		Name:      name,
		Backend:   "libvirt",
		Labels:    map[string]string{"kubernetes.io/hostname": name},
		Capacity:  Resources{VCPU: vcpu, MemoryBytes: memGiB * gib},
		Allocated: Resources{VCPU: usedVCPU, MemoryBytes: usedGiB * gib},
		LastSeen:  t0.Add(-time.Second),
	}
	for _, m := range mods {
		m(&n)
	}
	return n
}

// pools makes a node announce the shared storage pools ps.
func pools(ps ...string) func(*Node) {
	return func(n *Node) { n.SharedPools = ps }
}

func small(uid string) Request {
	return Request{UID: uid, Resources: Resources{VCPU: 1, MemoryBytes: gib}}
}

// held is a small request whose new disks are of the images imgs, which
// only the nodes holding them can make disks of.
func held(imgs ...HeldImage) Request {
	r := small("a")
	r.HeldImages = imgs
	return r
}

func TestPlace(t *testing.T) {
	cases := []struct {
		name      string
		nodes     []Node
		req       Request
		want      string
		wantNoFit map[string]string // node -> substring of its reason
		// wantCauses are the distinct causes of a refusal.
		wantCauses []Cause
	}{
		{
			name:  "least allocated node wins",
			nodes: []Node{node("node1", 8, 16, 4, 8), node("node2", 8, 16, 1, 2), node("node3", 8, 16, 6, 12)},
			req:   small("a"),
			want:  "node2",
		},
		{
			name:  "fuller dimension decides: plenty of vCPU does not hide full memory",
			nodes: []Node{node("node1", 64, 16, 0, 15), node("node2", 8, 16, 4, 4)},
			req:   small("a"),
			want:  "node2",
		},
		{
			name:  "ties go to the first name",
			nodes: []Node{node("node2", 8, 16, 0, 0), node("node1", 8, 16, 0, 0)},
			req:   small("a"),
			want:  "node1",
		},
		{
			name:  "stale heartbeat is passed over",
			nodes: []Node{node("node1", 8, 16, 0, 0, func(n *Node) { n.LastSeen = t0.Add(-30 * time.Second) }), node("node2", 8, 16, 6, 12)},
			req:   small("a"),
			want:  "node2",
		},
		{
			name:  "backend must match when requested",
			nodes: []Node{node("node1", 8, 16, 0, 0), node("cloud", 800, 1600, 0, 0, func(n *Node) { n.Backend = "nova" })},
			req:   Request{UID: "a", Resources: Resources{VCPU: 1, MemoryBytes: gib}, Backend: "libvirt"},
			want:  "node1",
		},
		{
			name:  "node selector must match every label",
			nodes: []Node{node("node1", 8, 16, 0, 0), node("node2", 8, 16, 4, 8, func(n *Node) { n.Labels["zone"] = "b" })},
			req:   Request{UID: "a", Resources: Resources{VCPU: 1, MemoryBytes: gib}, NodeSelector: map[string]string{"zone": "b"}},
			want:  "node2",
		},
		{
			name:  "volume locality pins the node even when another is emptier",
			nodes: []Node{node("node1", 8, 16, 0, 0), node("node2", 8, 16, 6, 12)},
			req:   Request{UID: "a", Resources: Resources{VCPU: 1, MemoryBytes: gib}, RequiredNode: "node2"},
			want:  "node2",
		},
		{
			name:  "no capacity anywhere says why per node",
			nodes: []Node{node("node1", 2, 16, 2, 0), node("node2", 8, 2, 0, 2)},
			req:   small("a"),
			wantNoFit: map[string]string{
				"node1": "0 vCPU free, 1 requested",
				"node2": "0 MiB memory free, 1024 MiB requested",
			},
			wantCauses: []Cause{CauseMemory, CauseVCPU},
		},
		{
			name:  "every reason is reported",
			nodes: []Node{node("old", 8, 16, 0, 0, func(n *Node) { n.LastSeen = t0.Add(-time.Minute) }), node("nova", 8, 16, 0, 0, func(n *Node) { n.Backend = "nova" })},
			req:   Request{UID: "a", Resources: Resources{VCPU: 1, MemoryBytes: gib}, Backend: "libvirt"},
			wantNoFit: map[string]string{
				"old":  "no heartbeat since 2026-11-22T11:59:00Z (more than 6s ago)",
				"nova": "backend nova, libvirt requested",
			},
			wantCauses: []Cause{CauseBackend, CauseStale},
		},
		{
			name:       "no nodes at all asks whether an agent runs",
			req:        small("a"),
			wantNoFit:  map[string]string{},
			wantCauses: []Cause{CauseNoNodes},
		},
		{
			name:       "a cordoned node takes no new guest, even one its volumes are bound to",
			nodes:      []Node{node("node1", 8, 16, 0, 0, func(n *Node) { n.Unschedulable = true }), node("node2", 8, 16, 6, 12)},
			req:        Request{UID: "a", Resources: Resources{VCPU: 1, MemoryBytes: gib}, RequiredNode: "node1"},
			wantNoFit:  map[string]string{"node1": "cordoned", "node2": "bound to node1"},
			wantCauses: []Cause{CauseCordoned, CauseVolumeNode},
		},
		{
			name:  "a cordoned node is passed over for another",
			nodes: []Node{node("node1", 8, 16, 0, 0, func(n *Node) { n.Unschedulable = true }), node("node2", 8, 16, 6, 12)},
			req:   small("a"),
			want:  "node2",
		},
		{
			name:       "a selector and a volume's node are causes of their own",
			nodes:      []Node{node("node1", 8, 16, 0, 0), node("node2", 8, 16, 0, 0)},
			req:        Request{UID: "a", Resources: Resources{VCPU: 1, MemoryBytes: gib}, RequiredNode: "node1", NodeSelector: map[string]string{"zone": "b"}},
			wantNoFit:  map[string]string{"node1": "label zone=b not present", "node2": "bound to node1"},
			wantCauses: []Cause{CauseSelector, CauseVolumeNode},
		},
		{
			name:  "a VM on shared pools goes to a node that reaches them all, even a fuller one",
			nodes: []Node{node("node1", 8, 16, 0, 0, pools("fast")), node("node2", 8, 16, 6, 12, pools("fast", "slow")), node("node3", 8, 16, 0, 0)},
			req:   Request{UID: "a", Resources: Resources{VCPU: 1, MemoryBytes: gib}, Pools: []string{"fast", "slow"}},
			want:  "node2",
		},
		{
			name:       "no node reaching a shared pool names the pool missing, node by node",
			nodes:      []Node{node("node1", 8, 16, 0, 0, pools("fast")), node("node2", 8, 16, 0, 0)},
			req:        Request{UID: "a", Resources: Resources{VCPU: 1, MemoryBytes: gib}, Pools: []string{"fast", "slow"}},
			wantNoFit:  map[string]string{"node1": "does not reach shared storage pool slow", "node2": "does not reach shared storage pool fast"},
			wantCauses: []Cause{CausePool},
		},
		{
			name:  "a VM on no shared pool goes anywhere, shared pools or not",
			nodes: []Node{node("node1", 8, 16, 4, 8, pools("fast")), node("node2", 8, 16, 0, 0)},
			req:   small("a"),
			want:  "node2",
		},
		{
			name:  "a VM whose new disk is of a held image goes to the least allocated node holding it, even a fuller one",
			nodes: []Node{node("node1", 8, 16, 0, 0), node("node2", 8, 16, 6, 12), node("node3", 8, 16, 4, 8)},
			req:   held(HeldImage{Name: "golden", Nodes: []string{"node2", "node3"}}),
			want:  "node3",
		},
		{
			name:  "a holder without a fresh heartbeat is passed over for another holder",
			nodes: []Node{node("node1", 8, 16, 0, 0, func(n *Node) { n.LastSeen = t0.Add(-30 * time.Second) }), node("node2", 8, 16, 6, 12), node("node3", 8, 16, 0, 0)},
			req:   held(HeldImage{Name: "golden", Nodes: []string{"node1", "node2"}}),
			want:  "node2",
		},
		{
			name:  "a node must hold every held image",
			nodes: []Node{node("node1", 8, 16, 0, 0), node("node2", 8, 16, 6, 12), node("node3", 8, 16, 0, 0)},
			req:   held(HeldImage{Name: "golden", Nodes: []string{"node1", "node2"}}, HeldImage{Name: "data", Nodes: []string{"node2", "node3"}}),
			want:  "node2",
		},
		{
			name:       "no node holding the image names it, node by node",
			nodes:      []Node{node("node1", 8, 16, 0, 0), node("node2", 8, 16, 0, 0)},
			req:        held(HeldImage{Name: "golden"}),
			wantNoFit:  map[string]string{"node1": "does not hold DiskImage golden", "node2": "does not hold DiskImage golden"},
			wantCauses: []Cause{CauseImageNode},
		},
		{
			name:       "a holder that is cordoned takes no new guest",
			nodes:      []Node{node("node1", 8, 16, 0, 0, func(n *Node) { n.Unschedulable = true }), node("node2", 8, 16, 0, 0)},
			req:        held(HeldImage{Name: "golden", Nodes: []string{"node1"}}),
			wantNoFit:  map[string]string{"node1": "cordoned", "node2": "does not hold DiskImage golden"},
			wantCauses: []Cause{CauseCordoned, CauseImageNode},
		},
		{
			name:  "a VM bound to one node by its volumes and to another by a held image fits nowhere",
			nodes: []Node{node("node1", 8, 16, 0, 0), node("node2", 8, 16, 0, 0)},
			req: func() Request {
				r := held(HeldImage{Name: "golden", Nodes: []string{"node2"}})
				r.RequiredNode = "node1"
				return r
			}(),
			wantNoFit:  map[string]string{"node1": "does not hold DiskImage golden", "node2": "bound to node1"},
			wantCauses: []Cause{CauseImageNode, CauseVolumeNode},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := New(WithClock(func() time.Time { return t0 }))
			got, err := p.Place(tc.nodes, tc.req)
			if tc.wantNoFit != nil {
				var noFit *NoFitError
				require.True(t, errors.As(err, &noFit), "got %v, %v", got, err)
				assert.Len(t, noFit.Reasons, len(tc.wantNoFit))
				for n, why := range tc.wantNoFit {
					assert.Contains(t, noFit.Reasons[n], why)
				}
				assert.Equal(t, tc.wantCauses, noFit.DistinctCauses())
				if len(tc.wantNoFit) == 0 {
					assert.Contains(t, err.Error(), "is an agent running")
				}
				_, reserved := p.Reserved(tc.req.UID)
				assert.False(t, reserved, "a failed placement reserves nothing")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

// TestBurstSpreadsAcrossNodes is the reason reservations exist: heartbeats
// lag behind placements, so without them a burst lands on one node.
func TestBurstSpreadsAcrossNodes(t *testing.T) {
	p := New(WithClock(func() time.Time { return t0 }))
	nodes := []Node{node("node1", 64, 128, 0, 0), node("node2", 64, 128, 0, 0), node("node3", 64, 128, 0, 0)}

	count := map[string]int{}
	for i := range 99 {
		n, err := p.Place(nodes, small(fmt.Sprintf("vm-%d", i)))
		require.NoError(t, err)
		count[n]++
	}
	assert.Equal(t, map[string]int{"node1": 33, "node2": 33, "node3": 33}, count)
}

func TestBurstStopsAtCapacity(t *testing.T) {
	p := New(WithClock(func() time.Time { return t0 }))
	nodes := []Node{node("node1", 4, 64, 0, 0)}
	for i := range 4 {
		_, err := p.Place(nodes, small(fmt.Sprintf("vm-%d", i)))
		require.NoError(t, err)
	}
	_, err := p.Place(nodes, small("vm-5"))
	var noFit *NoFitError
	require.True(t, errors.As(err, &noFit), "the fifth 1-vCPU VM must not fit a 4-vCPU node: %v", err)
	assert.Contains(t, noFit.Reasons["node1"], "0 vCPU free")
}

func TestReservationLifecycle(t *testing.T) {
	now := t0
	p := New(WithClock(func() time.Time { return now }), WithReservationTTL(time.Minute))
	nodes := []Node{node("node1", 8, 16, 0, 0), node("node2", 8, 16, 0, 0)}

	first, err := p.Place(nodes, small("a"))
	require.NoError(t, err)
	assert.Equal(t, "node1", first)

	t.Run("retrying the same UID returns the same node", func(t *testing.T) {
		nodes[0].Allocated = Resources{VCPU: 7, MemoryBytes: 15 * gib} // node1 now looks full
		again, err := p.Place(nodes, small("a"))
		require.NoError(t, err)
		assert.Equal(t, first, again)
	})

	t.Run("release frees the reservation", func(t *testing.T) {
		p.Release("a")
		_, ok := p.Reserved("a")
		assert.False(t, ok)
	})

	t.Run("reservations expire", func(t *testing.T) {
		_, err := p.Place(nodes, small("b"))
		require.NoError(t, err)
		now = now.Add(2 * time.Minute)
		nodes[0].LastSeen, nodes[1].LastSeen = now, now
		_, ok := p.Reserved("b")
		assert.False(t, ok, "an unconfirmed reservation must not hold capacity forever")
	})
}

// TestConfirmedReservationsLastUntilTheNextHeartbeat pins the hand-over from
// the hub's reservation to the node's own count.
func TestConfirmedReservationsLastUntilTheNextHeartbeat(t *testing.T) {
	now := t0
	p := New(WithClock(func() time.Time { return now }))
	nodes := []Node{node("node1", 8, 16, 0, 0), node("node2", 8, 16, 0, 0)}
	first, err := p.Place(nodes, small("a"))
	require.NoError(t, err)
	require.Equal(t, "node1", first)

	// The node reports the guest; its last heartbeat is older and does not
	// count it yet, so the reservation still holds.
	p.Confirm("a", t0.Add(time.Second))
	next, err := p.Place(nodes, small("b"))
	require.NoError(t, err)
	assert.Equal(t, "node2", next, "node1 still holds a's reservation")
	p.Release("b")

	// node1's next heartbeat counts the guest: the reservation goes, and
	// the heartbeat's own allocation takes over.
	nodes[0].LastSeen, nodes[0].Allocated = t0.Add(2*time.Second), Resources{VCPU: 1, MemoryBytes: gib}
	nodes[1].LastSeen = t0.Add(2 * time.Second)
	now = t0.Add(2 * time.Second)
	_, err = p.Place(nodes, small("c"))
	require.NoError(t, err)
	_, held := p.Reserved("a")
	assert.False(t, held, "a is counted by node1's heartbeat now, not twice")
}

// rack puts a node in rack r.
func rack(r string) func(*Node) {
	return func(n *Node) { n.Labels["topology.example/rack"] = r }
}

func TestPlacementGroups(t *testing.T) {
	three := []Node{node("node1", 8, 16, 0, 0), node("node2", 8, 16, 1, 1), node("node3", 8, 16, 2, 2)}
	racks := []Node{
		node("a1", 8, 16, 0, 0, rack("a")), node("a2", 8, 16, 0, 0, rack("a")),
		node("b1", 8, 16, 4, 8, rack("b")), node("b2", 8, 16, 4, 8, rack("b")),
	}
	group := func(anti, required bool, key string, members ...string) *Group {
		g := &Group{Key: "team-a/web", Name: "web", AntiAffinity: anti, Required: required, TopologyKey: key, Members: map[string]string{}}
		for i, n := range members {
			g.Members[fmt.Sprintf("member-%d", i)] = n
		}
		return g
	}
	with := func(g *Group) Request {
		r := small("vm")
		r.Group = g
		return r
	}
	cases := []struct {
		name  string
		nodes []Node
		req   Request
		want  string
		// noFit is a substring of every node's reason when none fits.
		noFit string
	}{
		{name: "required anti-affinity passes over the emptiest node when a member is there", nodes: three, req: with(group(true, true, "", "node1")), want: "node2"},
		{name: "required anti-affinity with a member on every node fits nowhere", nodes: three, req: with(group(true, true, "", "node1", "node2", "node3")), noFit: "placement group web (anti-affinity) has a VM in node "},
		{name: "preferred anti-affinity goes where fewest members are", nodes: three, req: with(group(true, false, "", "node1", "node2", "node3", "node1", "node2")), want: "node3"},
		{name: "preferred anti-affinity outweighs how full a node is", nodes: three, req: with(group(true, false, "", "node1")), want: "node2"},
		{name: "required affinity follows its members, however full their node", nodes: three, req: with(group(false, true, "", "node3")), want: "node3"},
		{name: "required affinity with no member yet goes anywhere", nodes: three, req: with(group(false, true, "")), want: "node1"},
		{name: "required affinity whose members' node cannot take the VM fits nowhere", nodes: []Node{node("node1", 8, 16, 0, 0), node("node2", 1, 1, 1, 1)}, req: with(group(false, true, "", "node2")), noFit: ""},
		{name: "preferred affinity joins its members", nodes: three, req: with(group(false, false, "", "node2")), want: "node2"},
		{name: "a topology key spreads over racks, not nodes", nodes: racks, req: with(group(true, true, "topology.example/rack", "a1")), want: "b1"},
		{name: "a member on a node the caller left out still counts there", nodes: three, req: with(group(true, true, "", "lost-node", "node1")), want: "node2"},
		{name: "affinity over racks stays in the members' rack", nodes: racks, req: with(group(false, true, "topology.example/rack", "b1")), want: "b1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := New(WithClock(func() time.Time { return t0 }))
			got, err := p.Place(tc.nodes, tc.req)
			if tc.want != "" {
				require.NoError(t, err)
				assert.Equal(t, tc.want, got)
				return
			}
			var noFit *NoFitError
			require.ErrorAs(t, err, &noFit)
			for n, reason := range noFit.Reasons {
				if tc.noFit != "" {
					assert.Contains(t, reason, tc.noFit, "node %s", n)
				}
			}
		})
	}
}

// TestABurstOfOneGroupSpreads places a group's VMs one after the other
// before the hub knows any bound: the Placer's own reservations keep
// them apart, and once the nodes run out the next fits nowhere.
func TestABurstOfOneGroupSpreads(t *testing.T) {
	p := New(WithClock(func() time.Time { return t0 }))
	nodes := []Node{node("node1", 8, 16, 0, 0), node("node2", 8, 16, 0, 0), node("node3", 8, 16, 0, 0)}
	g := &Group{Key: "team-a/web", Name: "web", AntiAffinity: true, Required: true}
	seen := map[string]bool{}
	for i := range 3 {
		req := small(fmt.Sprintf("vm-%d", i))
		req.Group = g
		got, err := p.Place(nodes, req)
		require.NoError(t, err)
		assert.False(t, seen[got], "vm-%d shares %s with another of its group", i, got)
		seen[got] = true
	}
	req := small("vm-3")
	req.Group = g
	_, err := p.Place(nodes, req)
	var noFit *NoFitError
	require.ErrorAs(t, err, &noFit)
	assert.Equal(t, []Cause{CauseGroup}, noFit.DistinctCauses())

	other := small("other")
	other.Group = &Group{Key: "team-b/web", Name: "web", AntiAffinity: true, Required: true}
	_, err = p.Place(nodes, other)
	require.NoError(t, err, "another namespace's group of the same name is another group")

	p.Release("vm-0")
	_, err = p.Place(nodes, req)
	require.NoError(t, err, "a released member frees its node for the group")
}

// TestABurstOfOneGroupObeysItsPolicy places four VMs of one group on three
// empty nodes one after the other, before the hub knows any of them bound:
// only the Placer's reservations tell each where the others went.
func TestABurstOfOneGroupObeysItsPolicy(t *testing.T) {
	cases := []struct {
		name           string
		anti, required bool
		// nodes is how many distinct nodes the placed VMs use; placed how
		// many of the four found one.
		nodes, placed int
	}{
		{name: "required anti-affinity: one per node, the fourth fits nowhere", anti: true, required: true, nodes: 3, placed: 3},
		{name: "preferred anti-affinity: one per node, then the fourth doubles up", anti: true, nodes: 3, placed: 4},
		{name: "required affinity: all on the first one's node", required: true, nodes: 1, placed: 4},
		{name: "preferred affinity: all on the first one's node, emptier nodes or not", nodes: 1, placed: 4},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := New(WithClock(func() time.Time { return t0 }))
			nodes := []Node{node("node1", 8, 16, 0, 0), node("node2", 8, 16, 0, 0), node("node3", 8, 16, 0, 0)}
			g := &Group{Key: "team-a/web", Name: "web", AntiAffinity: tc.anti, Required: tc.required}
			used := map[string]bool{}
			placed := 0
			for i := range 4 {
				req := small(fmt.Sprintf("vm-%d", i))
				req.Group = g
				got, err := p.Place(nodes, req)
				if err != nil {
					var noFit *NoFitError
					require.ErrorAs(t, err, &noFit)
					assert.Equal(t, []Cause{CauseGroup}, noFit.DistinctCauses())
					continue
				}
				placed++
				used[got] = true
			}
			assert.Equal(t, tc.placed, placed)
			assert.Len(t, used, tc.nodes)
		})
	}
}

// TestAMemberBoundAndStillReservedCountsOnce places a VM of a preferred
// spread group, then the next once the hub knows the first bound, before
// any heartbeat counts it: the first weighs on its node once, not as
// bound and again as reserved, so the emptier node still wins the tie of
// one member each.
func TestAMemberBoundAndStillReservedCountsOnce(t *testing.T) {
	p := New(WithClock(func() time.Time { return t0 }))
	nodes := []Node{node("node1", 8, 16, 0, 0), node("node2", 8, 16, 4, 8)}
	g := func(members map[string]string) *Group {
		return &Group{Key: "team-a/web", Name: "web", AntiAffinity: true, Members: members}
	}
	first := small("web-0")
	first.Group = g(map[string]string{"web-old": "node2"})
	got, err := p.Place(nodes, first)
	require.NoError(t, err)
	require.Equal(t, "node1", got, "away from the old member")

	next := small("web-1")
	next.Group = g(map[string]string{"web-old": "node2", "web-0": "node1"})
	got, err = p.Place(nodes, next)
	require.NoError(t, err)
	assert.Equal(t, "node1", got, "one member on each node: the emptier node wins")
}

// TestUnmet pins what a bound node must go on offering a VM whenever its
// intent changes: its backend, every label of its selector and every
// shared pool of its Volumes; and nothing else placement checks, so a full
// or cordoned node keeps the guests it has.
func TestUnmet(t *testing.T) {
	bound := node("node1", 4, 8, 4, 8, func(n *Node) {
		n.Labels["zone"] = "a"
		n.SharedPools = []string{"ceph"}
		n.Unschedulable = true
	})
	cases := map[string]struct {
		req        Request
		wantReason string
		wantCause  Cause
	}{
		"AllStillOffered":                {req: Request{Backend: "libvirt", NodeSelector: map[string]string{"zone": "a"}, Pools: []string{"ceph"}, Resources: Resources{VCPU: 4}}},
		"ASelectorLabelGone":             {req: Request{NodeSelector: map[string]string{"zone": "a", "disk": "ssd"}}, wantReason: "label disk=ssd not present", wantCause: CauseSelector},
		"SelectorLabelsGoneNameTheFirst": {req: Request{NodeSelector: map[string]string{"zone": "b", "rack": "r1", "disk": "ssd"}}, wantReason: "label disk=ssd not present", wantCause: CauseSelector},
		"ASelectorLabelOfNewValue":       {req: Request{NodeSelector: map[string]string{"zone": "b"}}, wantReason: "label zone=b not present", wantCause: CauseSelector},
		"APoolNotReached":                {req: Request{Pools: []string{"ceph", "nfs"}}, wantReason: "does not reach shared storage pool nfs", wantCause: CausePool},
		"AnotherBackend":                 {req: Request{Backend: "nova"}, wantReason: "backend libvirt, nova requested", wantCause: CauseBackend},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			reason, cause := Unmet(bound, tc.req)
			assert.Equal(t, tc.wantReason, reason)
			assert.Equal(t, tc.wantCause, cause)
		})
	}
}
