// Package placement chooses the node a VirtualMachine runs on. It is pure:
// the hub hands it the nodes it knows from heartbeats and a request, and it
// answers with a node or an error saying why no node fits. It keeps one piece
// of state, the reservations of placements whose guests the nodes' heartbeats
// do not count yet, so a burst of creates spreads instead of piling onto the
// node that looked emptiest a moment ago.
package placement

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
)

// Resources are amounts of what a guest uses on a node.
type Resources struct {
	VCPU        int64
	MemoryBytes int64
}

func (r Resources) add(o Resources) Resources {
	return Resources{VCPU: r.VCPU + o.VCPU, MemoryBytes: r.MemoryBytes + o.MemoryBytes}
}

// Node is what the hub knows of a node from its latest heartbeat.
type Node struct {
	Name    string
	Backend string
	Labels  map[string]string
	// Capacity is what the node offers to guests; Allocated what its guests
	// use, as the agent counted them.
	Capacity  Resources
	Allocated Resources
	// LastSeen is when the heartbeat arrived.
	LastSeen time.Time
	// Unschedulable is set when the node is cordoned: it takes no new
	// guest.
	Unschedulable bool
	// SharedPools are the shared storage pools the node reaches, as its
	// heartbeat announces them.
	SharedPools []string
}

// Request is one VirtualMachine to place.
type Request struct {
	// UID identifies the VirtualMachine; its reservation is kept under it.
	UID       string
	Resources Resources
	// Backend, when set, restricts placement to nodes of that backend.
	Backend string
	// NodeSelector restricts placement to nodes carrying all these labels.
	NodeSelector map[string]string
	// RequiredNode, when set, is the only node the guest may run on: the
	// node its node-local volumes are bound to.
	RequiredNode string
	// Pools are the shared storage pools the VM's Volumes live in: only a
	// node that reaches every one of them can open its disks.
	Pools []string
	// HeldImages are the images the VM's new disks can be made of only
	// where a node holds a copy already (a clone whose source is gone), as
	// RequiredNode is for disks made already: a node must hold every one.
	HeldImages []HeldImage
	// Group is the placement group the VM belongs to, if any.
	Group *Group
}

// HeldImage is an image that only the nodes holding it can make disks of,
// and those nodes.
type HeldImage struct {
	// Name is how messages call it (the DiskImage's name).
	Name  string
	Nodes []string
}

// unheld is the first of req's HeldImages that n does not hold, or "".
func (req Request) unheld(n Node) string {
	for _, img := range req.HeldImages {
		if !slices.Contains(img.Nodes, n.Name) {
			return img.Name
		}
	}
	return ""
}

// Group is a placement group as one of its VMs is placed: its policy, and
// the nodes its other VMs are on. The Placer adds the nodes of the group's
// reservations, so VMs of one group placed in one burst obey it too.
type Group struct {
	// Key tells groups apart across requests (namespace/name); Name is
	// how messages call it.
	Key, Name string
	// AntiAffinity spreads the group's VMs over topology domains; without
	// it they are kept in one.
	AntiAffinity bool
	// Required makes the policy a rule; otherwise it only orders nodes.
	Required bool
	// TopologyKey is the node label that names a node's domain; empty, or
	// a node without the label, makes the node its own domain.
	TopologyKey string
	// Members are the nodes the group's other VMs are bound to, by VM
	// uid.
	Members map[string]string
}

// Domain is the topology domain of node n in g.
func (g *Group) Domain(n Node) string {
	if v, ok := n.Labels[g.TopologyKey]; g.TopologyKey != "" && ok {
		return g.TopologyKey + "=" + v
	}
	return "node " + n.Name
}

// policy names g's policy in messages.
func (g *Group) policy() string {
	p := "anti-affinity"
	if !g.AntiAffinity {
		p = "affinity"
	}
	if !g.Required {
		p = "preferred " + p
	}
	return p
}

// Cause classifies why a node was passed over, in a few words an operator's
// metrics can count.
type Cause string

// Causes of passing a node over.
const (
	CauseCordoned   Cause = "cordoned"
	CauseVolumeNode Cause = "volume-node"
	CauseImageNode  Cause = "image-node"
	CauseStale      Cause = "stale-node"
	CauseBackend    Cause = "backend"
	CauseSelector   Cause = "selector"
	CauseVCPU       Cause = "vcpu"
	CauseMemory     Cause = "memory"
	CausePool       Cause = "storage-pool"
	CauseGroup      Cause = "placement-group"
	// CauseNoNodes: no node has sent a heartbeat.
	CauseNoNodes Cause = "no-nodes"
)

// Causes are every Cause.
var Causes = []Cause{CauseCordoned, CauseVolumeNode, CauseImageNode, CauseStale, CauseBackend, CauseSelector, CausePool, CauseGroup, CauseVCPU, CauseMemory, CauseNoNodes}

// NoFitError says why no node can take a request, node by node, in a form a
// user can act on from the VirtualMachine's conditions.
type NoFitError struct {
	// Reasons maps each known node to why it was passed over.
	Reasons map[string]string
	// Causes maps each known node to the Cause of its Reason.
	Causes map[string]Cause
}

// DistinctCauses are the causes that kept the nodes from taking the
// request, each once, sorted; CauseNoNodes when there was no node.
func (e *NoFitError) DistinctCauses() []Cause {
	if len(e.Causes) == 0 {
		return []Cause{CauseNoNodes}
	}
	seen := map[Cause]bool{}
	out := []Cause{}
	for _, c := range e.Causes {
		if !seen[c] {
			seen[c] = true
			out = append(out, c)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

func (e *NoFitError) Error() string {
	if len(e.Reasons) == 0 {
		return "no node has sent a heartbeat: is an agent running?"
	}
	names := make([]string, 0, len(e.Reasons))
	for n := range e.Reasons {
		names = append(names, n)
	}
	sort.Strings(names)
	parts := make([]string, 0, len(names))
	for _, n := range names {
		parts = append(parts, n+": "+e.Reasons[n])
	}
	return "no node fits: " + strings.Join(parts, "; ")
}

// Default timings.
const (
	// DefaultStaleAfter passes over nodes whose heartbeat (every 2 s) is
	// older than this; the nodes bucket forgets them after 10 s anyway.
	DefaultStaleAfter = 6 * time.Second
	// DefaultReservationTTL bounds how long a placement is counted against
	// a node without the hub confirming it: long enough for the agent to
	// create the guest and its next heartbeat to count it.
	DefaultReservationTTL = 60 * time.Second
)

type reservation struct {
	node string
	// group is the Key of the VM's placement group, if any.
	group     string
	resources Resources
	at        time.Time
	// confirmedAt is when the node reported the guest; the first
	// heartbeat after it counts the guest itself.
	confirmedAt time.Time
}

// Placer places requests on nodes. It is safe for concurrent use.
type Placer struct {
	staleAfter     time.Duration
	reservationTTL time.Duration
	now            func() time.Time

	mu           sync.Mutex
	reservations *book
}

// Option configures a Placer.
type Option func(*Placer)

// WithClock replaces time.Now, for tests.
func WithClock(now func() time.Time) Option { return func(p *Placer) { p.now = now } }

// WithStaleAfter sets how old a heartbeat may be.
func WithStaleAfter(d time.Duration) Option { return func(p *Placer) { p.staleAfter = d } }

// WithReservationTTL sets how long an unconfirmed placement is reserved.
func WithReservationTTL(d time.Duration) Option { return func(p *Placer) { p.reservationTTL = d } }

// New returns a Placer.
func New(o ...Option) *Placer {
	p := &Placer{
		staleAfter:     DefaultStaleAfter,
		reservationTTL: DefaultReservationTTL,
		now:            time.Now,
		reservations:   newBook(),
	}
	for _, fn := range o {
		fn(p)
	}
	return p
}

// Place chooses a node for req and reserves req's resources there until
// Confirm or Release is called for req.UID or the reservation expires.
// Placing a UID that already holds a reservation returns the same node
// (a retried Create must not move a guest). Among eligible nodes the least
// allocated wins, counting reservations; ties go to the lexically first
// name so placement is deterministic.
func (p *Placer) Place(nodes []Node, req Request) (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	p.expire(now)

	if r, ok := p.reservations.get(req.UID); ok {
		return r.node, nil
	}
	best, err := p.choose(nodes, req, now)
	if err != nil {
		return "", err
	}
	r := reservation{node: best, resources: req.Resources, at: now}
	if req.Group != nil {
		r.group = req.Group.Key
	}
	p.reservations.put(req.UID, r)
	return best, nil
}

// choose picks the least allocated eligible node, counting reservations
// the nodes' heartbeats do not count yet.
func (p *Placer) choose(nodes []Node, req Request, now time.Time) (string, error) {
	for _, n := range nodes {
		p.reservations.dropCounted(n.Name, n.LastSeen)
	}
	reserved := p.reservations.sum
	members := p.members(nodes, req)
	best, bestScore := "", math.Inf(1)
	noFit := &NoFitError{Reasons: map[string]string{}, Causes: map[string]Cause{}}
	for _, n := range nodes {
		reason, cause := p.ineligible(n, req, reserved[n.Name], now)
		if reason == "" {
			reason = members.refuses(n)
			cause = CauseGroup
		}
		if reason != "" {
			noFit.Reasons[n.Name], noFit.Causes[n.Name] = reason, cause
			continue
		}
		score := allocatedFraction(n.Capacity, n.Allocated.add(reserved[n.Name]).add(req.Resources)) + members.penalty(n)
		if score < bestScore || (score == bestScore && n.Name < best) {
			best, bestScore = n.Name, score
		}
	}
	if best == "" {
		return "", noFit
	}
	return best, nil
}

// groupMembers are the topology domains a request's group has VMs in,
// with how many.
type groupMembers struct {
	group   *Group
	domains map[string]int
}

// members are the domains of req's group's other VMs: those the hub knows
// bound, and those reserved. A VM both bound and still reserved counts
// once, where it is bound: counted twice, it would weigh double in a
// preferred policy until its node's next heartbeat. A live migration's
// reservation is not the VM's own (another uid), so a moving VM counts on
// both its nodes until it lands: neither may take another member of a
// spread group meanwhile. A member on a node not among nodes (lost, or
// passed over by the caller) is in that node's own domain.
func (p *Placer) members(nodes []Node, req Request) groupMembers {
	g := req.Group
	if g == nil {
		return groupMembers{}
	}
	byName := make(map[string]Node, len(nodes))
	for _, n := range nodes {
		byName[n.Name] = n
	}
	m := groupMembers{group: g, domains: map[string]int{}}
	count := func(node string) {
		n, ok := byName[node]
		if !ok {
			n = Node{Name: node}
		}
		m.domains[g.Domain(n)]++
	}
	for _, node := range g.Members {
		count(node)
	}
	for uid, node := range p.reservations.groupMembers(g.Key) {
		if _, bound := g.Members[uid]; !bound && uid != req.UID {
			count(node)
		}
	}
	return m
}

// refuses says why a required policy keeps the VM off n, or "".
func (m groupMembers) refuses(n Node) string {
	g := m.group
	if g == nil || !g.Required {
		return ""
	}
	d := g.Domain(n)
	switch {
	case g.AntiAffinity && m.domains[d] > 0:
		return fmt.Sprintf("placement group %s (%s) has a VM in %s already", g.Name, g.policy(), d)
	case !g.AntiAffinity && len(m.domains) > 0 && m.domains[d] == 0:
		return fmt.Sprintf("placement group %s (%s) keeps its VMs in %s", g.Name, g.policy(), strings.Join(slices.Sorted(maps.Keys(m.domains)), ", "))
	}
	return ""
}

// penalty orders nodes by a preferred policy: each VM of the group in n's
// domain counts as a whole node's worth of allocation, against n under
// anti-affinity and for it under affinity, so the policy outweighs how
// full the nodes are.
func (m groupMembers) penalty(n Node) float64 {
	g := m.group
	if g == nil || g.Required {
		return 0
	}
	count := float64(m.domains[g.Domain(n)])
	if g.AntiAffinity {
		return count
	}
	return -count
}

// Confirm records that the node reported uid's guest at the given time
// (the hub's clock, like Node.LastSeen). The reservation then lasts only
// until the node's next heartbeat, which counts the guest itself: dropping it
// at the report would make the node look emptier than it is until then, and
// keeping it longer would count the guest twice.
func (p *Placer) Confirm(uid string, at time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.reservations.confirm(uid, at)
}

// Release drops the reservation of uid: its guest will not be created after
// all, or is gone.
func (p *Placer) Release(uid string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.reservations.remove(uid)
}

// Free is what n has for a guest of it to grow into: its capacity less
// what its heartbeat counts and what is reserved on it for guests on their
// way there. It reads only.
func (p *Placer) Free(n Node) Resources {
	p.mu.Lock()
	defer p.mu.Unlock()
	return free(n, p.reservations.sum[n.Name])
}

// free is what n has left once its heartbeat's allocation and reserved
// are taken.
func free(n Node, reserved Resources) Resources {
	return Resources{
		VCPU:        n.Capacity.VCPU - n.Allocated.VCPU - reserved.VCPU,
		MemoryBytes: n.Capacity.MemoryBytes - n.Allocated.MemoryBytes - reserved.MemoryBytes,
	}
}

// Reserved reports the node uid is reserved on, if any.
func (p *Placer) Reserved(uid string) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.expire(p.now())
	r, ok := p.reservations.get(uid)
	return r.node, ok
}

func (p *Placer) expire(now time.Time) {
	p.reservations.expire(now, p.reservationTTL)
}

// ineligible says why n cannot take req and its cause, or "" when it can.
func (p *Placer) ineligible(n Node, req Request, reserved Resources, now time.Time) (string, Cause) {
	switch {
	case req.RequiredNode != "" && n.Name != req.RequiredNode:
		return "the VM's volumes are bound to " + req.RequiredNode, CauseVolumeNode
	case req.unheld(n) != "":
		return fmt.Sprintf("does not hold DiskImage %s, and the VM's new disks of it can only be made of a copy a node holds (the image's source is gone)", req.unheld(n)), CauseImageNode
	case n.Unschedulable:
		return "cordoned (spec.unschedulable of its HypervisorNode)", CauseCordoned
	case now.Sub(n.LastSeen) > p.staleAfter:
		// The time of the last heartbeat, not the time since: the reason
		// is shown in the VM's status, which is written only when the
		// reason changes.
		return fmt.Sprintf("no heartbeat since %s (more than %s ago)", n.LastSeen.UTC().Format(time.RFC3339), p.staleAfter), CauseStale
	}
	if reason, cause := Unmet(n, req); reason != "" {
		return reason, cause
	}
	free := free(n, reserved)
	if req.Resources.VCPU > free.VCPU {
		return fmt.Sprintf("%d vCPU free, %d requested", max(free.VCPU, 0), req.Resources.VCPU), CauseVCPU
	}
	if req.Resources.MemoryBytes > free.MemoryBytes {
		return fmt.Sprintf("%d MiB memory free, %d MiB requested", max(free.MemoryBytes, 0)>>20, req.Resources.MemoryBytes>>20), CauseMemory
	}
	return "", ""
}

// Unmet says what of req the node n does not offer, and its cause, or ""
// when it offers all of it: the backend, node selector and shared storage
// pools of a VM. Unlike the rest of what placement checks (room, cordon,
// a fresh heartbeat), these must still hold of a VM's node after it was
// placed there, whenever its intent changes: a guest whose node lacks its
// backend or its pools cannot be made as asked, and one whose selector no
// longer matches would run where its owner now says it must not.
func Unmet(n Node, req Request) (string, Cause) {
	if req.Backend != "" && n.Backend != req.Backend {
		return fmt.Sprintf("backend %s, %s requested", n.Backend, req.Backend), CauseBackend
	}
	if k, ok := unmatched(n.Labels, req.NodeSelector); ok {
		return fmt.Sprintf("label %s=%s not present", k, req.NodeSelector[k]), CauseSelector
	}
	for _, pool := range req.Pools {
		if !slices.Contains(n.SharedPools, pool) {
			return fmt.Sprintf("does not reach shared storage pool %s", pool), CausePool
		}
	}
	return "", ""
}

// unmatched is the first key of selector, in order, whose value labels
// lacks. It allocates nothing: it is asked of every node for every VM
// placed.
func unmatched(labels, selector map[string]string) (first string, found bool) {
	for k, v := range selector {
		if got, ok := labels[k]; (!ok || got != v) && (!found || k < first) {
			first, found = k, true
		}
	}
	return first, found
}

// allocatedFraction is the larger of the vCPU and memory fractions in use,
// so a node full on either dimension scores as full.
func allocatedFraction(capacity, used Resources) float64 {
	frac := func(u, c int64) float64 {
		if c <= 0 {
			return 1
		}
		return float64(u) / float64(c)
	}
	return max(frac(used.VCPU, capacity.VCPU), frac(used.MemoryBytes, capacity.MemoryBytes))
}
