package fleet

import (
	"slices"
	"strings"
	"time"

	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/bus"
)

// Report is one node's latest report of one uid and when the hub received
// it.
type Report[R any] struct {
	Node, UID string
	Revision  uint64
	Report    R
	// ReceivedAt is the hub's time of receipt, comparable with
	// NodeStatus.LastSeen: a heartbeat seen after it counts the report.
	ReceivedAt time.Time
}

// byNode are the reports of one uid, one per node that holds one. A uid is
// reported by one node, by two while its guest moves: a slice costs one
// report, where a map of one entry costs several times that.
type byNode[R any] []Report[R]

// get returns node's report.
func (b byNode[R]) get(node string) (Report[R], bool) {
	for _, rep := range b {
		if rep.Node == node {
			return rep, true
		}
	}
	return Report[R]{}, false
}

// with returns b with rep as its node's report.
func (b byNode[R]) with(rep Report[R]) byNode[R] {
	for i := range b {
		if b[i].Node == rep.Node {
			b[i] = rep
			return b
		}
	}
	return append(b, rep)
}

// without returns b without node's report.
func (b byNode[R]) without(node string) byNode[R] {
	return slices.DeleteFunc(b, func(rep Report[R]) bool { return rep.Node == node })
}

// Reports is the fleet's view of one kind of report: every node's latest
// report of every uid, kept by the fleet's report watch.
type Reports[R any] struct {
	fleet *Fleet
	kind  wire.Kind[R]
	// resource is the kind of resource the reports are about, as
	// FlagForeign shows and counts them: "VirtualMachine".
	resource string
	// byUID are the reports by uid, then by the node that wrote them.
	byUID map[string]byNode[R]
	subs  []func(uid string)
	// foreign are the reports already flagged by FlagForeign, so each is
	// flagged once per revision, and the deletions of flagged reports,
	// flagged at the next FlagForeign.
	foreign map[claim]foreignState
	// index, when set, picks the reports indexed lists too, for a question
	// asked often that only a few reports answer (Orphan).
	index   func(R) bool
	indexed map[claim]struct{}
	// followsNodes has the subscribers also hear of every uid a node
	// reports on when that node is lost or comes back: what they show
	// depends on the node's liveness as much as on its reports.
	followsNodes bool
}

// claim is one node's report about one uid.
type claim struct{ uid, node string }

// view is what the report watch needs of a Reports, whatever its kind.
type view interface {
	// uid returns the uid of a report key's rest (see wire.ParseKey) and
	// true when the key is of the view's kind.
	uid(rest string) (string, bool)
	// apply takes node's entry about uid.
	apply(e bus.Entry, node, uid string) error
	// nodeFlipped returns what to tell the subscribers now that node was
	// lost or came back, to be called once fleet.mu is released; nil when
	// the view does not follow its nodes. fleet.mu must be held.
	nodeFlipped(node string) func()
}

// Watch makes f keep every node's latest report of kind k, whose values are
// in the reports bucket, about resources of the kind named resource. Call it
// before Run.
func Watch[R any](f *Fleet, k wire.Kind[R], resource string) *Reports[R] {
	if k.Bucket != wire.BucketReports {
		panic("fleet: kind " + k.Name + " is not in the reports bucket")
	}
	r := &Reports[R]{
		fleet:    f,
		kind:     k,
		resource: resource,
		byUID:    map[string]byNode[R]{},
		foreign:  map[claim]foreignState{},
		indexed:  map[claim]struct{}{},
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.views = append(f.views, r)
	return r
}

// Subscribe registers fn to be called with the uid of every report that
// changed. fn must not block.
func (r *Reports[R]) Subscribe(fn func(uid string)) {
	r.fleet.mu.Lock()
	defer r.fleet.mu.Unlock()
	r.subs = append(r.subs, fn)
}

// Report returns node's latest report of uid. Pass the node the resource is
// placed on: what another node says of it is not its state.
func (r *Reports[R]) Report(node, uid string) (Report[R], bool) {
	r.fleet.mu.RLock()
	defer r.fleet.mu.RUnlock()
	return r.byUID[uid].get(node)
}

// All returns every node's report of uid, sorted by node: for cleaning up
// after a resource that no longer exists, when no node is recorded
// anywhere.
func (r *Reports[R]) All(uid string) []Report[R] {
	r.fleet.mu.RLock()
	defer r.fleet.mu.RUnlock()
	out := append(make([]Report[R], 0, len(r.byUID[uid])), r.byUID[uid]...)
	slices.SortFunc(out, func(a, b Report[R]) int { return strings.Compare(a.Node, b.Node) })
	return out
}

// Reporters returns the nodes that report uid, sorted.
func (r *Reports[R]) Reporters(uid string) []string {
	r.fleet.mu.RLock()
	defer r.fleet.mu.RUnlock()
	return r.reporters(uid)
}

// reporters are the nodes holding a report of uid, sorted. fleet.mu must
// be held.
func (r *Reports[R]) reporters(uid string) []string {
	nodes := make([]string, 0, len(r.byUID[uid]))
	for _, rep := range r.byUID[uid] {
		nodes = append(nodes, rep.Node)
	}
	slices.Sort(nodes)
	return nodes
}

func (r *Reports[R]) uid(rest string) (string, bool) { return r.kind.UID(rest) }

func (r *Reports[R]) apply(e bus.Entry, node, uid string) error {
	rep := Report[R]{Node: node, UID: uid, Revision: e.Revision}
	if !e.Deleted {
		var err error
		if rep.Report, err = r.kind.DecodeAt(e.Key, node, uid, e.Value); err != nil {
			return err
		}
	}
	f := r.fleet
	f.mu.Lock()
	rep.ReceivedAt = f.now()
	r.store(e.Deleted, rep)
	subs := r.subs
	f.mu.Unlock()
	for _, fn := range subs {
		fn(uid)
	}
	return nil
}

// store keeps rep as its node's report of its uid, or forgets it when
// deleted. The deletion of a report already flagged as foreign is
// remembered for FlagForeign; any other deletion of a report the hub never
// held says nothing and is not remembered (a node may delete its own keys
// at will). fleet.mu must be held.
func (r *Reports[R]) store(deleted bool, rep Report[R]) {
	c := claim{uid: rep.UID, node: rep.Node}
	held := r.byUID[c.uid]
	delete(r.indexed, c)
	if deleted {
		if _, ok := held.get(c.node); ok {
			if st, flagged := r.foreign[c]; flagged && !st.deleted {
				r.foreign[c] = foreignState{deleted: true}
			}
		}
		if held = held.without(c.node); len(held) == 0 {
			delete(r.byUID, c.uid)
		} else {
			r.byUID[c.uid] = held
		}
		return
	}
	r.byUID[c.uid] = held.with(rep)
	if r.index != nil && r.index(rep.Report) {
		r.indexed[c] = struct{}{}
	}
	// A new revision is flagged anew.
	delete(r.foreign, c)
}

func (r *Reports[R]) nodeFlipped(node string) func() {
	if !r.followsNodes {
		return nil
	}
	uids, subs := r.uidsOn(node), r.subs
	return func() {
		for _, uid := range uids {
			for _, fn := range subs {
				fn(uid)
			}
		}
	}
}

// uidsOn are the uids node reports on. fleet.mu must be held.
func (r *Reports[R]) uidsOn(node string) []string {
	var uids []string
	for uid, held := range r.byUID {
		if _, ok := held.get(node); ok {
			uids = append(uids, uid)
		}
	}
	return uids
}
