package fleet

import (
	"crypto/hmac"
	"slices"
	"strings"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
)

// Orphan is a guest a node keeps without a VM: released from the VM
// Namespace/Name, reported under UID on Node.
type Orphan struct {
	Node, UID string
	Report    Report[wire.Report]
}

// ErrReportsNotSynced is returned while the hub has not read every report
// yet, so it cannot tell whether an orphan is there.
var ErrReportsNotSynced = errors.New("the hub has not read the nodes' reports yet")

// Synced says whether the report watch has read every report that existed
// when it began: until then, a report the fleet does not hold may yet
// arrive, and its absence says nothing.
func (f *Fleet) Synced() bool {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.reportsSynced
}

// Orphan returns an orphaned guest released from the VM namespace/name on a
// live node, if there is one; of several, the one with the lowest uid, so
// every reconcile picks the same. Only an orphan this hub released counts:
// its report carries the seal of the release marker (OrphanSeal), which a
// node cannot make, so a node cannot draw a VM to itself by reporting an
// orphan of its name. Until the reports are read it returns
// ErrReportsNotSynced.
func (f *Fleet) Orphan(namespace, name string) (Orphan, bool, error) {
	found, err := f.orphans(func(node string, o *wire.Orphan) bool {
		return o.Namespace == namespace && o.Name == name && !f.nodes[node].Lost
	})
	if err != nil || len(found) == 0 {
		return Orphan{}, false, err
	}
	return slices.MinFunc(found, func(a, b Orphan) int { return strings.Compare(a.UID, b.UID) }), true, nil
}

// Orphans are the orphaned guests released from VMs of namespace, which
// hold their share of the namespace's quota until they are deleted: those
// of a lost node too, since losing its heartbeat does not delete a guest.
// Only those this hub released count, as for Orphan. Until the reports are
// read it returns ErrReportsNotSynced.
func (f *Fleet) Orphans(namespace string) ([]Orphan, error) {
	return f.orphans(func(_ string, o *wire.Orphan) bool { return o.Namespace == namespace })
}

// orphans are the sealed orphans that match; match runs with f.mu held.
func (f *Fleet) orphans(match func(node string, o *wire.Orphan) bool) ([]Orphan, error) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	if !f.reportsSynced {
		return nil, ErrReportsNotSynced
	}
	var found []Orphan
	for k := range f.Guests.indexed {
		r, _ := f.Guests.byUID[k.uid].get(k.node)
		o := r.Report.Orphan
		if !match(k.node, o) ||
			!hmac.Equal([]byte(o.Seal), []byte(f.OrphanSeal(k.uid, k.node, o.Namespace, o.Name))) {
			continue
		}
		found = append(found, Orphan{Node: k.node, UID: k.uid, Report: r})
	}
	return found, nil
}
