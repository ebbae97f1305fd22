package census

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"

	"github.com/virtfleet/virtfleet/apis"
	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/bus"
	"github.com/virtfleet/virtfleet/hub/internal/fleet"
	"github.com/virtfleet/virtfleet/hub/internal/fleet/fleettest"
)

// vm is a VM on node, placed there by the hub of f; with f nil, by a hand
// that wrote the annotation.
func vm(f *fleet.Fleet, name, node string, phase v1alpha1.Phase) *v1alpha1.VirtualMachine {
	v := &v1alpha1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}}
	if node != "" {
		v.SetAnnotations(map[string]string{v1alpha1.AnnotationNode: node})
	}
	if node != "" && f != nil {
		v.Annotations[v1alpha1.AnnotationSeal] = f.Seal(string(v.UID), node, "")
	}
	v.Status.AtProvider.Phase = phase
	return v
}

func snapshot(name string, phase v1alpha1.SnapshotPhase) *v1alpha1.VirtualMachineSnapshot {
	s := &v1alpha1.VirtualMachineSnapshot{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}}
	s.Status.Phase = phase
	return s
}

func backup(name string, phase v1alpha1.BackupPhase) *v1alpha1.VirtualMachineBackup {
	b := &v1alpha1.VirtualMachineBackup{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}}
	b.Status.Phase = phase
	return b
}

func image(name string, phase v1alpha1.ImagePhase) *v1alpha1.DiskImage {
	i := &v1alpha1.DiskImage{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}}
	i.Status.AtProvider.Phase = phase
	return i
}

// TestCensus pins each gauge against a fleet and a cache whose answer is
// known: VMs by phase and their node's backend (none before placement,
// Pending without a phase), DiskImages, snapshots and backups by phase, and per node its
// resources, VMs, readiness and last heartbeat, a lost node included. A VM
// whose node annotation a tenant wrote by hand is on no node: it counts
// on none, with no backend.
func TestCensus(t *testing.T) {
	scheme := runtime.NewScheme()
	require.NoError(t, apis.AddToScheme(scheme))
	b := bus.NewFake()
	f := fleettest.Start(t, b)
	kube := fake.NewClientBuilder().WithScheme(scheme).WithObjects(
		vm(f, "a", "node1", v1alpha1.PhaseRunning),
		vm(f, "b", "node1", v1alpha1.PhaseRunning),
		vm(f, "c", "node2", v1alpha1.PhaseUnknown),
		vm(f, "d", "", ""),
		vm(nil, "by-hand", "node1", v1alpha1.PhaseRunning),
		image("debian", v1alpha1.ImagePhaseReady),
		image("broken", v1alpha1.ImagePhaseFailed),
		image("new", ""),
		snapshot("taken", v1alpha1.SnapshotSucceeded),
		snapshot("also-taken", v1alpha1.SnapshotSucceeded),
		snapshot("new", ""),
		backup("nightly", v1alpha1.BackupSucceeded),
		backup("broken", v1alpha1.BackupFailed),
		backup("running", v1alpha1.BackupInProgress),
		backup("new", ""),
	).Build()

	for _, n := range []string{"node1", "node2"} {
		b.SetNode(bus.NodeEvent{Node: n, Heartbeat: wire.NodeHeartbeat{
			Node: n, Backend: "libvirt",
			Capacity:  wire.Resources{VCPU: 8, MemoryBytes: 16 << 30, StorageBytes: 100 << 30},
			Allocated: wire.Resources{VCPU: 2, MemoryBytes: 1 << 30},
		}})
	}
	b.SetNode(bus.NodeEvent{Node: "node2", Lost: true})
	require.Eventually(t, func() bool { return f.Node("node2").Lost && !f.Node("node1").LastSeen.IsZero() }, 5*time.Second, time.Millisecond)
	seen := f.Node("node1").LastSeen

	elected := make(chan struct{})
	c := New(kube, func() []*fleet.Fleet { return []*fleet.Fleet{f} }, elected, logging.NewNopLogger())
	assert.Equal(t, 0, testutil.CollectAndCount(c), "a replica that is not the leader counts nothing")
	close(elected)
	want := `
# HELP virtfleet_hub_vms VirtualMachines by status phase and by the backend of the node they are placed on (none before placement).
# TYPE virtfleet_hub_vms gauge
virtfleet_hub_vms{backend="libvirt",phase="Running"} 2
virtfleet_hub_vms{backend="libvirt",phase="Unknown"} 1
virtfleet_hub_vms{backend="none",phase="Pending"} 1
virtfleet_hub_vms{backend="none",phase="Running"} 1
# HELP virtfleet_hub_diskimages DiskImages by status phase.
# TYPE virtfleet_hub_diskimages gauge
virtfleet_hub_diskimages{phase="Failed"} 1
virtfleet_hub_diskimages{phase="Pending"} 1
virtfleet_hub_diskimages{phase="Ready"} 1
# HELP virtfleet_hub_vm_snapshots VirtualMachineSnapshots by status phase.
# TYPE virtfleet_hub_vm_snapshots gauge
virtfleet_hub_vm_snapshots{phase="Pending"} 1
virtfleet_hub_vm_snapshots{phase="Succeeded"} 2
# HELP virtfleet_hub_vm_backups VirtualMachineBackups by status phase.
# TYPE virtfleet_hub_vm_backups gauge
virtfleet_hub_vm_backups{phase="Failed"} 1
virtfleet_hub_vm_backups{phase="InProgress"} 1
virtfleet_hub_vm_backups{phase="Pending"} 1
virtfleet_hub_vm_backups{phase="Succeeded"} 1
# HELP virtfleet_hub_node_vms VirtualMachines placed on a node.
# TYPE virtfleet_hub_node_vms gauge
virtfleet_hub_node_vms{node="node1"} 2
virtfleet_hub_node_vms{node="node2"} 1
virtfleet_hub_node_vms{node="sentinel"} 0
# HELP virtfleet_hub_node_ready 1 while a node's heartbeats arrive, 0 once the hub counts it lost; a lost node stays until the hub restarts.
# TYPE virtfleet_hub_node_ready gauge
virtfleet_hub_node_ready{node="node1"} 1
virtfleet_hub_node_ready{node="node2"} 0
virtfleet_hub_node_ready{node="sentinel"} 0
`
	assert.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(want),
		"virtfleet_hub_vms", "virtfleet_hub_diskimages", "virtfleet_hub_vm_snapshots", "virtfleet_hub_vm_backups", "virtfleet_hub_node_vms", "virtfleet_hub_node_ready"))

	// Resources, per node and kind, as the latest heartbeat said.
	assert.Equal(t, 3*2*2+3*2, testutil.CollectAndCount(c, "virtfleet_hub_node_capacity", "virtfleet_hub_node_allocated"),
		"three resources, capacity and allocated, of node1, node2 and the sentinel")
	got := gather(t, c)
	assert.Equal(t, float64(16<<30), got[`virtfleet_hub_node_capacity{backend="libvirt",node="node1",resource="memory",unit="byte"}`])
	assert.Equal(t, float64(2), got[`virtfleet_hub_node_allocated{backend="libvirt",node="node2",resource="vcpu",unit="core"}`], "a lost node keeps what it last said")
	assert.InDelta(t, float64(seen.UnixMilli())/1000, got[`virtfleet_hub_node_last_heartbeat_timestamp_seconds{node="node1"}`], 0.001)
	_, ok := got[`virtfleet_hub_node_last_heartbeat_timestamp_seconds{node="sentinel"}`]
	assert.False(t, ok, "no heartbeat time for a node never heard from")
}

// gather is every sample c collects, by name{labels} in Prometheus' text
// form with labels sorted.
func gather(t *testing.T, c prometheus.Collector) map[string]float64 {
	t.Helper()
	r := prometheus.NewPedanticRegistry()
	require.NoError(t, r.Register(c))
	families, err := r.Gather()
	require.NoError(t, err)
	out := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+`="`+l.GetValue()+`"`)
			}
			out[f.GetName()+"{"+strings.Join(labels, ",")+"}"] = m.GetGauge().GetValue()
		}
	}
	return out
}

// TestCensusWithoutCRDs leaves out the gauges of kinds the cache cannot
// list yet and still counts the nodes.
func TestCensusWithoutCRDs(t *testing.T) {
	kube := fake.NewClientBuilder().WithScheme(runtime.NewScheme()).Build()
	b := bus.NewFake()
	f := fleettest.Start(t, b)
	elected := make(chan struct{})
	close(elected)
	c := New(kube, func() []*fleet.Fleet { return []*fleet.Fleet{f} }, elected, logging.NewNopLogger())
	assert.Equal(t, 0, testutil.CollectAndCount(c, "virtfleet_hub_vms", "virtfleet_hub_diskimages", "virtfleet_hub_vm_snapshots", "virtfleet_hub_vm_backups"))
	assert.Equal(t, 1, testutil.CollectAndCount(c, "virtfleet_hub_node_ready"), "the sentinel node")
}
