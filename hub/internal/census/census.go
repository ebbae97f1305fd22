// Package census serves the hub's gauges of the fleet: VirtualMachines by
// phase and backend, DiskImages, VirtualMachineSnapshots and
// VirtualMachineBackups by phase, and
// each node's capacity, allocation, VMs and health. They are counted when
// Prometheus scrapes,
// from the hub's cache and its view of the nodes' heartbeats, so they cost
// nothing between scrapes and cannot drift from what kubectl shows.
package census

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/bus"
	"github.com/virtfleet/virtfleet/hub/internal/controller/virtualmachine"
	"github.com/virtfleet/virtfleet/hub/internal/fleet"
	"github.com/virtfleet/virtfleet/internal/metrics"
)

// listTimeout bounds how long one scrape waits for the cache; a cache that
// is not synced yet (the CRDs are not installed) leaves its gauges out.
const listTimeout = 5 * time.Second

// Census is a prometheus.Collector of the fleet's gauges.
type Census struct {
	cache   client.Reader
	fleets  func() []*fleet.Fleet
	elected <-chan struct{}
	log     logging.Logger
}

// New counts the objects cache holds and the nodes of fleets, once elected
// is closed: of a hub's replicas only the leader counts, so that a sum over
// the replicas' series counts each VM once.
func New(cache client.Reader, fleets func() []*fleet.Fleet, elected <-chan struct{}, log logging.Logger) *Census {
	return &Census{cache: cache, fleets: fleets, elected: elected, log: log}
}

// Describe sends the descriptors of every gauge.
func (c *Census) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{metrics.VMs, metrics.DiskImages, metrics.VMSnapshots, metrics.VMBackups, metrics.NodeCapacity, metrics.NodeAllocated, metrics.NodeVMs, metrics.NodeReady, metrics.NodeLastHeartbeat, metrics.BucketBytes, metrics.BucketMaxBytes, metrics.BucketValues, metrics.NodeReportValues, metrics.NodeReportMaxValues, metrics.NodeReportBytes, metrics.NodeReportMaxBytes} {
		ch <- d
	}
}

// Collect counts, if elected.
func (c *Census) Collect(ch chan<- prometheus.Metric) {
	select {
	case <-c.elected:
	default:
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), listTimeout)
	defer cancel()
	nodes := map[string]fleet.NodeStatus{}
	nodeFleet := map[string]*fleet.Fleet{}
	for _, f := range c.fleets() {
		for name, s := range f.NodeStatuses() {
			nodes[name], nodeFleet[name] = s, f
		}
	}
	c.collectBuckets(ctx, ch)
	perNode := c.collectVMs(ctx, ch, nodes, nodeFleet)
	collectPhases(ctx, c, ch, metrics.DiskImages, &v1alpha1.DiskImageList{}, func(l *v1alpha1.DiskImageList) []string {
		out := make([]string, 0, len(l.Items))
		for i := range l.Items {
			out = append(out, cmp.Or(string(l.Items[i].Status.AtProvider.Phase), string(v1alpha1.ImagePhasePending)))
		}
		return out
	})
	collectPhases(ctx, c, ch, metrics.VMSnapshots, &v1alpha1.VirtualMachineSnapshotList{}, func(l *v1alpha1.VirtualMachineSnapshotList) []string {
		out := make([]string, 0, len(l.Items))
		for i := range l.Items {
			out = append(out, cmp.Or(string(l.Items[i].Status.Phase), string(v1alpha1.SnapshotPending)))
		}
		return out
	})
	collectPhases(ctx, c, ch, metrics.VMBackups, &v1alpha1.VirtualMachineBackupList{}, func(l *v1alpha1.VirtualMachineBackupList) []string {
		out := make([]string, 0, len(l.Items))
		for i := range l.Items {
			out = append(out, cmp.Or(string(l.Items[i].Status.Phase), string(v1alpha1.BackupPending)))
		}
		return out
	})
	for name, s := range nodes {
		hb := s.Heartbeat
		for _, r := range []struct {
			resource, unit      string
			capacity, allocated int64
		}{
			{"vcpu", "core", hb.Capacity.VCPU, hb.Allocated.VCPU},
			{"memory", "byte", hb.Capacity.MemoryBytes, hb.Allocated.MemoryBytes},
			{"storage", "byte", hb.Capacity.StorageBytes, hb.Allocated.StorageBytes},
		} {
			ch <- gauge(metrics.NodeCapacity, float64(r.capacity), name, hb.Backend, r.resource, r.unit)
			ch <- gauge(metrics.NodeAllocated, float64(r.allocated), name, hb.Backend, r.resource, r.unit)
		}
		ready := 1.0
		if s.Lost {
			ready = 0
		}
		ch <- gauge(metrics.NodeReady, ready, name)
		ch <- gauge(metrics.NodeVMs, float64(perNode[name]), name)
		if !s.LastSeen.IsZero() {
			ch <- gauge(metrics.NodeLastHeartbeat, float64(s.LastSeen.UnixMilli())/1000, name)
		}
	}
}

// bucketReader is a fleet's bus that tells how full its buckets are
// (*bus.NATS).
type bucketReader interface {
	BucketUsage(ctx context.Context) ([]bus.BucketUsage, error)
	NodeReportUsage(ctx context.Context) ([]bus.NodeReportUsage, error)
}

// collectBuckets sends how full each fleet's buckets are, and each node's
// reports, so that an alert can warn before a bucket refuses writes and
// show a node at its bound. Fleets on the same servers send
// them once; a fleet whose servers do not answer sends none.
func (c *Census) collectBuckets(ctx context.Context, ch chan<- prometheus.Metric) {
	sent := map[[2]string]bool{}
	for _, f := range c.fleets() {
		r, ok := f.Bus.(bucketReader)
		if !ok {
			continue
		}
		usage, err := r.BucketUsage(ctx)
		if err != nil {
			c.log.Debug("Cannot read the buckets' usage", "error", err)
			continue
		}
		for _, u := range usage {
			if k := [2]string{u.NATS, u.Bucket}; !sent[k] {
				sent[k] = true
				ch <- gauge(metrics.BucketBytes, float64(u.Bytes), u.NATS, u.Bucket)
				ch <- gauge(metrics.BucketMaxBytes, float64(u.MaxBytes), u.NATS, u.Bucket)
				ch <- gauge(metrics.BucketValues, float64(u.Values), u.NATS, u.Bucket)
			}
		}
		nodes, err := r.NodeReportUsage(ctx)
		if err != nil {
			c.log.Debug("Cannot read the nodes' reports usage", "error", err)
			continue
		}
		for _, u := range nodes {
			if k := [2]string{u.NATS, "node " + u.Node}; !sent[k] {
				sent[k] = true
				ch <- gauge(metrics.NodeReportValues, float64(u.Values), u.NATS, u.Node)
				ch <- gauge(metrics.NodeReportMaxValues, float64(u.MaxValues), u.NATS, u.Node)
				ch <- gauge(metrics.NodeReportBytes, float64(u.Bytes), u.NATS, u.Node)
				ch <- gauge(metrics.NodeReportMaxBytes, float64(u.MaxBytes), u.NATS, u.Node)
			}
		}
	}
}

// collectVMs sends the VMs by phase and backend and returns how many are
// placed on each node. A VM without a phase yet counts as Pending, which is
// what its empty STATUS means. A VM is on a node only as the VM controller
// admits it there in the node's fleet (nodeFleet; virtualmachine.IsOn),
// as kubectl's count of the node's VMs has it: a node annotation a tenant
// wrote by hand places nothing there.
func (c *Census) collectVMs(ctx context.Context, ch chan<- prometheus.Metric, nodes map[string]fleet.NodeStatus, nodeFleet map[string]*fleet.Fleet) map[string]int {
	vms := &v1alpha1.VirtualMachineList{}
	if err := c.cache.List(ctx, vms, client.UnsafeDisableDeepCopy); err != nil {
		c.log.Debug("Cannot count VirtualMachines", "error", err)
		return nil
	}
	type key struct{ phase, backend string }
	counts := map[key]int{}
	perNode := map[string]int{}
	for i := range vms.Items {
		vm := &vms.Items[i]
		k := key{phase: string(vm.Status.AtProvider.Phase), backend: metrics.BackendNone}
		if k.phase == "" {
			k.phase = string(v1alpha1.PhasePending)
		}
		if node := vm.GetAnnotations()[v1alpha1.AnnotationNode]; c.isOn(ctx, vm, node, nodeFleet[node]) {
			perNode[node]++
			if b := nodes[node].Heartbeat.Backend; b != "" {
				k.backend = b
			}
		}
		counts[k]++
	}
	for k, n := range counts {
		ch <- gauge(metrics.VMs, float64(n), k.phase, k.backend)
	}
	return perNode
}

// isOn says whether vm is on node of fleet f; nil is a node no fleet
// knows, whose gauges are not sent. A VM the cache cannot answer for
// counts on no node this scrape.
func (c *Census) isOn(ctx context.Context, vm *v1alpha1.VirtualMachine, node string, f *fleet.Fleet) bool {
	if f == nil {
		return false
	}
	on, err := virtualmachine.IsOn(ctx, c.cache, vm, node, []*fleet.Fleet{f})
	if err != nil {
		c.log.Debug("Cannot tell whether a VirtualMachine is on its node", "namespace", vm.Namespace, "name", vm.Name, "node", node, "error", err)
	}
	return on
}

// collectPhases sends d, the objects of a kind by phase: phases are those
// of the objects list holds, one without a phase yet counting as Pending,
// what its empty status means.
func collectPhases[L client.ObjectList](ctx context.Context, c *Census, ch chan<- prometheus.Metric, d *prometheus.Desc, list L, phases func(L) []string) {
	if err := c.cache.List(ctx, list, client.UnsafeDisableDeepCopy); err != nil {
		c.log.Debug("Cannot count objects by phase", "kind", fmt.Sprintf("%T", list), "error", err)
		return
	}
	counts := map[string]int{}
	for _, p := range phases(list) {
		counts[p]++
	}
	for p, n := range counts {
		ch <- gauge(d, float64(n), p)
	}
}

func gauge(d *prometheus.Desc, v float64, labels ...string) prometheus.Metric {
	return prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
}
