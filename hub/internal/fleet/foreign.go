package fleet

import (
	"slices"
	"strings"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/event"

	"github.com/virtfleet/virtfleet/internal/metrics"
)

// ReasonForeignReport is the Warning event of a report about a resource from
// a node the resource is not placed on.
const ReasonForeignReport event.Reason = "ForeignReport"

// Operations on a report key, as the foreign-report metric labels them.
const (
	OperationPut    = "put"
	OperationDelete = "delete"
)

// foreignState is what the fleet remembers of a flagged report: that it was
// flagged (until its next revision), or that it was deleted since, which is
// flagged in turn.
type foreignState struct {
	deleted bool
}

// FlagForeign counts, logs and shows as a Warning event on o every report
// about o (by its uid) from a node other than placed, the nodes o is placed
// on; each put once per revision, and the deletion of a report it flagged.
// Reconcilers call it whenever they read o's reports; it never blocks. With
// no placed node nothing can be told apart yet and nothing is flagged.
func (r *Reports[R]) FlagForeign(o client.Object, placed ...string) {
	if len(placed) == 0 {
		return
	}
	f := r.fleet
	uid := string(o.GetUID())
	type flag struct{ node, op string }
	var flags []flag
	f.mu.Lock()
	for _, node := range r.reporters(uid) {
		c := claim{uid: uid, node: node}
		if _, done := r.foreign[c]; done || slices.Contains(placed, node) {
			continue
		}
		r.foreign[c] = foreignState{}
		flags = append(flags, flag{node, OperationPut})
	}
	for c, st := range r.foreign {
		if c.uid != uid || !st.deleted {
			continue
		}
		delete(r.foreign, c)
		if !slices.Contains(placed, c.node) {
			flags = append(flags, flag{c.node, OperationDelete})
		}
	}
	f.mu.Unlock()

	slices.SortFunc(flags, func(a, b flag) int { return strings.Compare(a.node+a.op, b.node+b.op) })
	where := strings.Join(placed, ", ")
	for _, fl := range flags {
		metrics.ForeignReports.WithLabelValues(r.resource, fl.node, fl.op).Inc()
		metrics.ReportsIgnored.WithLabelValues(metrics.ReasonForeignNode).Inc()
		f.log.Info("Ignored a report from a node the resource is not placed on",
			"kind", r.resource, "namespace", o.GetNamespace(), "name", o.GetName(), "uid", uid, "node", fl.node, "placedOn", where, "operation", fl.op)
		what := "sent a report of"
		if fl.op == OperationDelete {
			what = "deleted its report of"
		}
		f.recorder.Event(o, event.Warning(ReasonForeignReport, errors.Errorf(
			"node %s %s this %s, which is placed on node %s; the hub ignores it", fl.node, what, r.resource, where)))
	}
}
