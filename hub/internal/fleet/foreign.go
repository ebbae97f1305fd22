package fleet

import (
	"slices"
	"strings"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/event"

	"github.com/virtfleet/virtfleet/internal/metrics"
)

// ReportKind names what a report is about.
type ReportKind string

// The kinds of reports a node writes.
const (
	KindVM     ReportKind = "VirtualMachine"
	KindVolume ReportKind = "Volume"
	KindImage  ReportKind = "DiskImage"
)

// ReasonForeignReport is the Warning event of a report about a resource from
// a node the resource is not placed on.
const ReasonForeignReport event.Reason = "ForeignReport"

// Operations on a report key, as the foreign-report metric labels them.
const (
	OperationPut    = "put"
	OperationDelete = "delete"
)

// claim is one node's report about one uid.
type claim struct {
	kind      ReportKind
	uid, node string
}

// foreignState is what the fleet remembers of a flagged report: that it was
// flagged (until its next revision), or that it was deleted since, which is
// flagged in turn.
type foreignState struct {
	deleted bool
}

// FlagForeign counts, logs and shows as a Warning event on o every report of
// kind about o (by its uid) from a node other than placed, the nodes o is
// placed on; each put once per revision, and the deletion of a report it
// flagged. Reconcilers call it whenever they read o's reports; it never
// blocks. With no placed node nothing can be told apart yet and nothing is
// flagged.
func (f *Fleet) FlagForeign(kind ReportKind, o client.Object, placed ...string) {
	if len(placed) == 0 {
		return
	}
	uid := string(o.GetUID())
	type flag struct{ node, op string }
	var flags []flag
	f.mu.Lock()
	for _, node := range f.reporters(kind, uid) {
		c := claim{kind: kind, uid: uid, node: node}
		if _, done := f.foreign[c]; done || slices.Contains(placed, node) {
			continue
		}
		f.foreign[c] = foreignState{}
		flags = append(flags, flag{node, OperationPut})
	}
	for c, st := range f.foreign {
		if c.kind != kind || c.uid != uid || !st.deleted {
			continue
		}
		delete(f.foreign, c)
		if !slices.Contains(placed, c.node) {
			flags = append(flags, flag{c.node, OperationDelete})
		}
	}
	f.mu.Unlock()

	slices.SortFunc(flags, func(a, b flag) int { return strings.Compare(a.node+a.op, b.node+b.op) })
	where := strings.Join(placed, ", ")
	for _, fl := range flags {
		metrics.ForeignReports.WithLabelValues(string(kind), fl.node, fl.op).Inc()
		metrics.ReportsIgnored.WithLabelValues(metrics.ReasonForeignNode).Inc()
		f.log.Info("Ignored a report from a node the resource is not placed on",
			"kind", kind, "namespace", o.GetNamespace(), "name", o.GetName(), "uid", uid, "node", fl.node, "placedOn", where, "operation", fl.op)
		what := "sent a report of"
		if fl.op == OperationDelete {
			what = "deleted its report of"
		}
		f.recorder.Event(o, event.Warning(ReasonForeignReport, errors.Errorf(
			"node %s %s this %s, which is placed on node %s; the hub ignores it", fl.node, what, kind, where)))
	}
}

// reporters are the nodes holding a report of kind about uid. f.mu must be
// held.
func (f *Fleet) reporters(kind ReportKind, uid string) []string {
	var nodes []string
	switch kind {
	case KindVM:
		for n := range f.reports[uid] {
			nodes = append(nodes, n)
		}
	case KindVolume:
		for n := range f.volumeReports[uid] {
			nodes = append(nodes, n)
		}
	case KindImage:
		for n := range f.imageReports[uid] {
			nodes = append(nodes, n)
		}
	}
	slices.Sort(nodes)
	return nodes
}
