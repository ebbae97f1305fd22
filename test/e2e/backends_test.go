package e2e

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gophercloud/gophercloud/v2/openstack/blockstorage/v3/volumes"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/flavors"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/instanceactions"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/keypairs"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/servers"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/agent/driver/nova"
	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/harness/openstack"
	"github.com/virtfleet/virtfleet/internal/harness/openstacktest"
	"github.com/virtfleet/virtfleet/internal/harness/stack"
)

// TestBackends runs the hub's scenarios against one agent of each proxy
// backend, in a fleet that also has a libvirt node. The VMs ask for the
// backend by spec.forProvider.backend and nothing else: the hub knows a
// node's backend only from its heartbeat. Each backend gets its own stack,
// so a failure in one does not hide the other.
func TestBackends(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the whole stack; skipped with -short")
	}
	t.Parallel()
	for _, backend := range []string{driver.BackendNova, driver.BackendKubeVirt} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			testBackend(t, backend)
		})
	}
}

func testBackend(t *testing.T, backend string) {
	node := backend + "1"
	// A real key: Nova fingerprints it and refuses anything else.
	key := openstacktest.PublicKey("test@virtfleet")
	h := startStack(t, "vf-"+backend+"-", stack.Options{
		Nodes:        []string{"node1", node},
		Backends:     map[string]string{node: backend},
		Subresources: true,
		// testBootFromImage sees a Glance image pruned after pruneAfter.
		// Each round lists the cloud's images and volumes, every round of
		// the whole test: a few seconds keep the wait short without
		// making the lists most of what Glance and Cinder do.
		ImagePruneInterval: 5 * time.Second,
		// testRealNovaBackup backs the real guest up to it.
		ObjectStore: backend == driver.BackendNova,
	})
	h.create(t, &v1alpha1.VirtualNetwork{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "net-db"},
		Spec:       v1alpha1.VirtualNetworkSpec{ForProvider: v1alpha1.VirtualNetworkParameters{CIDR: "10.10.120.0/24"}},
	})
	on := func(vm *v1alpha1.VirtualMachine) *v1alpha1.VirtualMachine {
		vm.Spec.ForProvider.Backend = ptr(v1alpha1.Backend(backend))
		vm.Spec.ForProvider.PublicKey = key
		return vm
	}
	h.create(t, volume("vm-root"))
	h.create(t, on(vmWith("vm", "vm-root")))

	t.Run("CreateRunsOnTheBackendWithHostAndAddresses", func(t *testing.T) {
		first := 60 * time.Second
		if backend == driver.BackendNova {
			// Real Nova's first build on a loaded 2-core machine: its
			// services load most of their code at their first request.
			first = 3 * time.Minute
		}
		vm := h.wait(t, "vm", first, running)
		assert.Equal(t, node, vm.GetAnnotations()[v1alpha1.AnnotationNode], "placed on the %s agent's node", backend)
		assert.NotEmpty(t, vm.Status.AtProvider.Node, "the real host the backend runs the guest on")
		assert.NotEmpty(t, vm.Status.AtProvider.ID, "the backend's id of the guest")
		assert.Regexp(t, regexp.MustCompile(`^net-db\(\d+\.\d+\.\d+\.\d+\)$`), vm.Status.AtProvider.IP)
		for _, i := range vm.Status.AtProvider.Interfaces {
			assert.NotEmpty(t, i.Source, "interface %s has no address source", i.Network)
		}
		assert.Equal(t, 1, h.domains(t, node)[string(vm.UID)])
		if backend == driver.BackendNova {
			// NODE is Nova's OS-EXT-SRV-ATTR:host (the report's host), while
			// the placement annotation stays the agent's node, the only one
			// whose reports the hub takes for this VM.
			host := novaCloud(t).server(t, vm.Status.AtProvider.ID).Host
			assert.Equal(t, openstack.ForTest(t).ComputeHost, host, "Nova placed it on the compute host")
			assert.Equal(t, host, vm.Status.AtProvider.Node, "NODE is the compute host Nova reports")
		}
	})

	t.Run("RunningFalseStopsAndTrueStarts", func(t *testing.T) {
		h.patch(t, "vm", func(vm *v1alpha1.VirtualMachine) { vm.Spec.ForProvider.Running = ptr(false) })
		h.wait(t, "vm", 60*time.Second, phase(v1alpha1.PhaseStopped))
		h.patch(t, "vm", func(vm *v1alpha1.VirtualMachine) { vm.Spec.ForProvider.Running = ptr(true) })
		h.wait(t, "vm", 60*time.Second, running)
	})

	t.Run("RestartAnnotationRestartsOnce", func(t *testing.T) {
		before := h.get(t, "vm").Status.AtProvider.RestartCount
		h.patch(t, "vm", func(vm *v1alpha1.VirtualMachine) {
			vm.SetAnnotations(merge(vm.GetAnnotations(), v1alpha1.AnnotationRestartRequestedAt, time.Now().Format(time.RFC3339)))
		})
		h.wait(t, "vm", 60*time.Second, func(vm *v1alpha1.VirtualMachine) bool {
			return vm.Status.AtProvider.RestartCount == before+1 && running(vm)
		})
		h.never(t, "vm", 3*time.Second, func(vm *v1alpha1.VirtualMachine) bool { return vm.Status.AtProvider.RestartCount != before+1 },
			"one restart per annotation value")
	})

	t.Run("PauseAndConsoleThroughThePlugin", func(t *testing.T) {
		admin := userPlugin(t, h, h.s.Plugin(), "system:admin", "system:masters")
		out, err := admin("pause", "vm")
		require.NoError(t, err, out)
		h.wait(t, "vm", 60*time.Second, phase(v1alpha1.PhasePaused))
		out, err = admin("unpause", "vm")
		require.NoError(t, err, out)
		h.wait(t, "vm", 60*time.Second, running)
		if backend == driver.BackendNova {
			// The real services' compute runs Nova's fake virt driver, with
			// serial consoles off: Nova's own refusal reaches the user.
			out, err := admin("console", "vm")
			require.Error(t, err)
			assert.Contains(t, out, "Unavailable console type serial")
			return
		}
		assert.Contains(t, consolePrompt(t, h, "vm"), " login: ", "the VMI's serial console, through virt-api")
	})

	if backend == driver.BackendKubeVirt {
		t.Run("VcpuWithinTheMaximumAppliesLive", func(t *testing.T) {
			before := h.get(t, "vm")
			h.patch(t, "vm", func(vm *v1alpha1.VirtualMachine) { vm.Spec.ForProvider.Vcpu = 2 })
			vm := h.wait(t, "vm", 60*time.Second, func(vm *v1alpha1.VirtualMachine) bool { return vm.Status.AtProvider.Vcpu == 2 })
			assert.NotEqual(t, corev1.ConditionTrue, vm.GetCondition("RestartRequired").Status, "KubeVirt hot-plugs it")
			assert.True(t, running(vm))
			assert.Equal(t, before.Status.AtProvider.ID, vm.Status.AtProvider.ID)
			assert.Equal(t, before.Status.AtProvider.RestartCount, vm.Status.AtProvider.RestartCount, "not restarted")
			assert.EqualValues(t, 4, vm.Status.AtProvider.MaxVcpu, "the maximum it started with")
		})
	}

	t.Run("SpecChangeWhileRunningSetsRestartRequired", func(t *testing.T) {
		h.patch(t, "vm", func(vm *v1alpha1.VirtualMachine) {
			if backend == driver.BackendKubeVirt {
				// KubeVirt hot-plugs memory only into a guest of 1Gi
				// or more.
				vm.Spec.ForProvider.Memory = resource.MustParse("256Mi")
				return
			}
			vm.Spec.ForProvider.Vcpu = 2
		})
		vm := h.wait(t, "vm", 60*time.Second, func(vm *v1alpha1.VirtualMachine) bool {
			return vm.GetCondition("RestartRequired").Status == corev1.ConditionTrue
		})
		assert.Equal(t, v1alpha1.PhaseRunning, vm.Status.AtProvider.Phase, "the VM keeps running")
	})

	if backend == driver.BackendNova {
		testNovaShapeChanges(t, h)
	}

	testBootFromImage(t, h, backend, node, on)
	if backend == driver.BackendNova {
		testRealNovaGuest(t, h, on)
	}

	t.Run("AgentKilledMidCreateLeavesExactlyOneGuest", func(t *testing.T) {
		const n = 5
		for i := range n {
			h.create(t, volume(fmt.Sprintf("burst-%d", i)))
			h.create(t, on(vmWith(fmt.Sprintf("burst-%d", i), fmt.Sprintf("burst-%d", i))))
		}
		h.s.KillAgent(node)
		h.wait(t, "vm", 20*time.Second, phase(v1alpha1.PhaseUnknown))
		require.NoError(t, h.s.StartAgent(node))
		guests := h.domains(t, node)
		for i := range n {
			vm := h.wait(t, fmt.Sprintf("burst-%d", i), 90*time.Second, running)
			guests = h.domains(t, node)
			assert.Equal(t, 1, guests[string(vm.UID)], "VM %s", vm.Name)
		}
		vm := h.wait(t, "vm", 60*time.Second, running)
		assert.Equal(t, 1, guests[string(vm.UID)], "the first VM survived the agent's restart once")
	})

	t.Run("ASnapshotIsTakenWhereTheBackendKeepsOnesElseRefusedWithTheReason", func(t *testing.T) {
		snapshot := func(name string, memory bool) *v1alpha1.VirtualMachineSnapshot {
			t.Helper()
			h.create(t, &v1alpha1.VirtualMachineSnapshot{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
				Spec:       v1alpha1.VirtualMachineSnapshotSpec{VMName: "vm", IncludeMemory: memory},
			})
			s := &v1alpha1.VirtualMachineSnapshot{}
			require.Eventually(t, func() bool {
				return h.kube.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, s) == nil && s.Done()
			}, 2*time.Minute, 100*time.Millisecond, "snapshot %s: last status %+v", name, &s.Status)
			return s
		}
		s := snapshot("vm-kept", false)
		assert.Equal(t, v1alpha1.SnapshotSucceeded, s.Status.Phase, s.Status.Message)
		// Nova's: a Cinder snapshot of each volume; KubeVirt's: its
		// VirtualMachineSnapshot.
		assert.True(t, s.Status.ReadyToUse, "the backend's snapshot of the guest")
		h.deleteObject(t, s)
		m := snapshot("vm-memory", true)
		assert.Equal(t, v1alpha1.SnapshotFailed, m.Status.Phase)
		assert.False(t, m.Status.ReadyToUse)
		assert.Contains(t, m.Status.Message, map[string]string{
			driver.BackendNova: "Nova keeps no guest memory", driver.BackendKubeVirt: "KubeVirt keeps no guest memory",
		}[backend])
	})

	if backend == driver.BackendNova {
		testNovaCloneOfASnapshot(t, h, node)
	}

	t.Run("AMigrationMovesTheGuestToAnotherHostOfTheBackend", func(t *testing.T) {
		before := h.get(t, "vm").Status.AtProvider.Node
		if backend == driver.BackendNova {
			// The test cloud's second compute host, off until now so that
			// the VMs above booted on ComputeHost.
			cloud := openstack.ForTest(t)
			require.NoError(t, cloud.SetSpareHostEnabled(context.Background(), true))
			t.Cleanup(func() { assert.NoError(t, cloud.SetSpareHostEnabled(context.Background(), false)) })
		}
		h.create(t, &v1alpha1.VirtualMachineMigration{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "vm-away"},
			Spec:       v1alpha1.VirtualMachineMigrationSpec{VMName: "vm"},
		})
		m := h.waitMigration(t, "vm-away", 3*time.Minute)
		// What the backend said of the hosts it moved the guest between.
		t.Logf("migration %s from %s: %s", m.Status.Phase, before, m.Status.Message)
		require.Equal(t, v1alpha1.MigrationSucceeded, m.Status.Phase, m.Status.Message)
		assert.Equal(t, node, m.Status.SourceNode)
		assert.Equal(t, node, m.Status.TargetNode, "the VM stays on the %s node; its backend moves it between its hosts", backend)
		vm := h.wait(t, "vm", 30*time.Second, func(vm *v1alpha1.VirtualMachine) bool {
			return running(vm) && vm.Status.AtProvider.Node != before && vm.GetAnnotations()[v1alpha1.AnnotationMigration] == ""
		})
		assert.Equal(t, node, vm.GetAnnotations()[v1alpha1.AnnotationNode])
		assert.NotEmpty(t, vm.Status.AtProvider.Node, "NODE shows the backend's new host")
	})

	t.Run("DeleteRemovesTheGuestAndKeepsTheVolume", func(t *testing.T) {
		uid := string(h.get(t, "vm").UID)
		h.delete(t, "vm")
		assert.Zero(t, h.domains(t, node)[uid], "the guest is deleted with the VM")
		err := h.kube.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: "vm-root"}, &v1alpha1.Volume{})
		assert.False(t, kerrors.IsNotFound(err), "the Volume stays")
		if backend == driver.BackendNova {
			n := novaCloud(t)
			assert.Contains(t, n.volumes(t), ns+"_vm-root", "the Cinder volume stays")
			assert.Contains(t, n.volumes(t), ns+"_vm-data", "the extra disk's Cinder volume stays")
			assert.NotContains(t, n.flavors(t), "vf-c2-m128-s0", "the private flavor goes with its last user")
			assert.NotEmpty(t, n.keypairs(t), "the keypair stays while the burst VMs use it")
		}
	})

	if backend == driver.BackendNova {
		t.Run("TheLastUserTakesKeypairAndFlavorWithIt", func(t *testing.T) {
			for i := range 5 {
				h.delete(t, fmt.Sprintf("burst-%d", i))
			}
			assert.Empty(t, h.domains(t, node))
			n := novaCloud(t)
			assert.Empty(t, n.keypairs(t))
			assert.Empty(t, n.flavors(t))
		})
	}
}

// testNovaCloneOfASnapshot clones a snapshot of vm on the nova node, as
// a user would: kubectl virtfleet snapshot, then clone --snapshot. Cinder
// makes the new VM's volume of the snapshot's Cinder snapshot; the new VM
// runs on the nova node and its DiskImage is Ready. Everything made is
// deleted again, so that vm moves on without a snapshot.
func testNovaCloneOfASnapshot(t *testing.T, h *hub, node string) {
	t.Run("ACloneOfASnapshotRunsOnTheNovaNode", func(t *testing.T) {
		out, err := h.plugin("snapshot", "vm", "--name", "vm-golden", "--wait", "2m")
		require.NoError(t, err, out)
		out, err = h.plugin("clone", "vm-golden", "vm-copy", "--snapshot", "--name", "vm-copy", "--wait", "5m")
		require.NoError(t, err, out)
		assert.Contains(t, out, "VirtualMachineClone "+ns+"/vm-copy succeeded")
		vm := h.wait(t, "vm-copy", time.Minute, running)
		assert.Equal(t, node, vm.GetAnnotations()[v1alpha1.AnnotationNode], "where the snapshot is")
		assert.Contains(t, novaCloud(t).volumes(t), ns+"_vm-copy-vm-root", "Cinder made the volume of the snapshot")
		img := &v1alpha1.DiskImage{}
		require.Eventually(t, func() bool {
			return h.kube.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: "vm-copy-vm-root"}, img) == nil &&
				img.Status.AtProvider.Phase == v1alpha1.ImagePhaseReady
		}, time.Minute, 100*time.Millisecond, "the DiskImage is Ready; last status %+v", &img.Status.AtProvider)

		h.delete(t, "vm-copy")
		for _, o := range []client.Object{
			&v1alpha1.Volume{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "vm-copy-vm-root"}},
			&v1alpha1.VirtualMachineSnapshot{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "vm-golden"}},
		} {
			h.deleteObject(t, o)
		}
	})
}

// testNovaShapeChanges changes vm's vcpus (SpecChangeWhileRunning set
// them to 2) and adds a disk, each as real Nova allows: the vCPUs by a
// resize of the stopped server at the next start, confirmed once; the disk
// by a volume attachment to the running server.
func testNovaShapeChanges(t *testing.T, h *hub) {
	t.Run("VcpuChangeResizesAtTheNextStartConfirmedOnce", func(t *testing.T) {
		h.patch(t, "vm", func(vm *v1alpha1.VirtualMachine) { vm.Spec.ForProvider.Running = ptr(false) })
		h.wait(t, "vm", 60*time.Second, phase(v1alpha1.PhaseStopped))
		h.patch(t, "vm", func(vm *v1alpha1.VirtualMachine) { vm.Spec.ForProvider.Running = ptr(true) })
		// A resize, its confirmation and a start, each a round of real
		// Nova's services over RabbitMQ: on a loaded 2-core machine, as
		// slow as a first build.
		vm := h.wait(t, "vm", 3*time.Minute, func(vm *v1alpha1.VirtualMachine) bool {
			return running(vm) && vm.GetCondition("RestartRequired").Status != corev1.ConditionTrue
		})
		n := novaCloud(t)
		s := n.server(t, vm.Status.AtProvider.ID)
		assert.EqualValues(t, 2, s.Flavor["vcpus"], "resized")
		assert.Equal(t, 1, n.actions(t, s.ID)["confirmResize"], "confirmed once, though Nova confirms asynchronously")
	})

	t.Run("ExtraDiskAttachesWhileTheServerRuns", func(t *testing.T) {
		before := h.get(t, "vm")
		h.create(t, volume("vm-data"))
		h.patch(t, "vm", func(vm *v1alpha1.VirtualMachine) {
			vm.Spec.ForProvider.DiskAttachments = append(vm.Spec.ForProvider.DiskAttachments, v1alpha1.DiskAttachment{Name: "vm-data"})
		})
		n := novaCloud(t)
		require.Eventually(t, func() bool {
			return len(n.server(t, before.Status.AtProvider.ID).AttachedVolumes) == 2
		}, 90*time.Second, time.Second, "Nova attaches vm-data beside the boot volume")
		vm := h.get(t, "vm")
		assert.True(t, running(vm))
		assert.NotEqual(t, corev1.ConditionTrue, vm.GetCondition("RestartRequired").Status, "a disk added needs no restart")
		assert.Equal(t, before.Status.AtProvider.ID, vm.Status.AtProvider.ID, "the same server")
		assert.Equal(t, before.Status.AtProvider.RestartCount, vm.Status.AtProvider.RestartCount, "not restarted")
	})
}

// novaView looks at the shared real OpenStack as its admin, behind the
// driver's back.
type novaView struct{ cl *openstack.Clients }

func novaCloud(t *testing.T) novaView {
	t.Helper()
	cl, err := openstack.ForTest(t).Clients(context.Background())
	require.NoError(t, err)
	return novaView{cl: cl}
}

func (n novaView) server(t *testing.T, id string) *servers.Server {
	t.Helper()
	c := *n.cl.Compute
	c.Microversion = nova.Microversion
	s, err := servers.Get(context.Background(), &c, id).Extract()
	require.NoError(t, err)
	return s
}

// actions counts a server's instance actions by name.
func (n novaView) actions(t *testing.T, id string) map[string]int {
	t.Helper()
	page, err := instanceactions.List(n.cl.Compute, id, nil).AllPages(context.Background())
	require.NoError(t, err)
	all, err := instanceactions.ExtractInstanceActions(page)
	require.NoError(t, err)
	out := map[string]int{}
	for _, a := range all {
		out[a.Action]++
	}
	return out
}

// volumes are the Cinder volumes' names.
func (n novaView) volumes(t *testing.T) []string {
	t.Helper()
	page, err := volumes.List(n.cl.Volume, volumes.ListOpts{AllTenants: true}).AllPages(context.Background())
	require.NoError(t, err)
	all, err := volumes.ExtractVolumes(page)
	require.NoError(t, err)
	var out []string
	for _, v := range all {
		out = append(out, v.Name)
	}
	return out
}

// flavors are the names of the driver's flavors.
func (n novaView) flavors(t *testing.T) []string {
	t.Helper()
	page, err := flavors.ListDetail(n.cl.Compute, flavors.ListOpts{AccessType: flavors.AllAccess}).AllPages(context.Background())
	require.NoError(t, err)
	all, err := flavors.ExtractFlavors(page)
	require.NoError(t, err)
	var out []string
	for _, f := range all {
		if strings.HasPrefix(f.Name, nova.Prefix) {
			out = append(out, f.Name)
		}
	}
	return out
}

// keypairs are the names of the driver's keypairs.
func (n novaView) keypairs(t *testing.T) []string {
	t.Helper()
	page, err := keypairs.List(n.cl.Compute, nil).AllPages(context.Background())
	require.NoError(t, err)
	all, err := keypairs.ExtractKeyPairs(page)
	require.NoError(t, err)
	var out []string
	for _, k := range all {
		if strings.HasPrefix(k.Name, nova.Prefix) {
			out = append(out, k.Name)
		}
	}
	return out
}
