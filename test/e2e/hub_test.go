package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
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
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/harness/controlplane"
	"github.com/virtfleet/virtfleet/internal/harness/stack"
)

const ns = "default"

// resyncEvery is TestHub's hub poll and agent resync interval.
const resyncEvery = 2 * time.Second

// TestHub runs the hub against a real kube-apiserver, a real nats-server and
// three real agents on private libvirtds, and drives it only through the
// Kubernetes API, as a user would. The scenarios share one stack and run in
// order; each names the behaviour it pins.
func TestHub(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the whole stack; skipped with -short")
	}
	t.Parallel()
	// Short poll and resync intervals, so that RestartAnnotationRestartsOnce
	// can watch several of each go by.
	h := startStack(t, "vf-hub-", stack.Options{FencingTimeout: 5 * time.Second, PollInterval: resyncEvery, ResyncInterval: resyncEvery})
	s := h.s

	// All examples, with the stack's image server standing in for the
	// image host the example DiskImage names.
	_, err := s.ApplyExamples(context.Background(), filepath.Join(controlplane.RepoRoot(), "examples"))
	require.NoError(t, err)

	t.Run("SeedVMRunsWithNodeIDAndAddresses", func(t *testing.T) {
		vm := h.wait(t, "sample-vm", 60*time.Second, running)
		o := vm.Status.AtProvider
		assert.Contains(t, []string{"node1", "node2", "node3"}, o.Node)
		assert.Equal(t, string(vm.UID), o.ID, "the libvirt domain UUID is the VM's uid")
		assert.Regexp(t, regexp.MustCompile(`^net-db\(10\.10\.120\.\d+\), net-backend\(10\.10\.150\.\d+\), net-frontend\(10\.10\.110\.\d+\)$`), o.IP)
		assert.Equal(t, int32(0), o.RestartCount)
		assert.Equal(t, corev1.ConditionTrue, vm.GetCondition(xpv2.TypeReady).Status)
		assert.Equal(t, corev1.ConditionTrue, vm.GetCondition(xpv2.TypeSynced).Status)
		for _, i := range o.Interfaces {
			assert.NotEmpty(t, i.Source, "interface %s has no address source", i.Network)
		}
	})

	t.Run("TheHubRunsWithOnlyItsDeployedRights", func(t *testing.T) {
		cfg, err := clientcmd.BuildConfigFromFlags("", s.HubKubeconfig())
		require.NoError(t, err)
		as, err := client.New(cfg, client.Options{Scheme: s.ControlPlane.Scheme})
		require.NoError(t, err)
		err = as.List(context.Background(), &corev1.SecretList{})
		assert.True(t, kerrors.IsForbidden(err), "the hub may get a named Secret but never list them: %v", err)
		err = as.Get(context.Background(), types.NamespacedName{Namespace: stack.SystemNamespace, Name: stack.HubSecretName}, &corev1.Secret{})
		assert.NoError(t, err, "the hub reads its NATS credentials")
	})

	t.Run("RunningFalseStopsAndTrueStarts", func(t *testing.T) {
		h.patch(t, "sample-vm", func(vm *v1alpha1.VirtualMachine) { vm.Spec.ForProvider.Running = ptr(false) })
		h.wait(t, "sample-vm", 30*time.Second, phase(v1alpha1.PhaseStopped))
		h.patch(t, "sample-vm", func(vm *v1alpha1.VirtualMachine) { vm.Spec.ForProvider.Running = ptr(true) })
		h.wait(t, "sample-vm", 30*time.Second, running)
	})

	t.Run("RestartAnnotationRestartsOnce", func(t *testing.T) {
		h.patch(t, "sample-vm", func(vm *v1alpha1.VirtualMachine) {
			vm.SetAnnotations(merge(vm.GetAnnotations(), v1alpha1.AnnotationRestartRequestedAt, time.Now().Format(time.RFC3339)))
		})
		h.wait(t, "sample-vm", 30*time.Second, func(vm *v1alpha1.VirtualMachine) bool { return vm.Status.AtProvider.RestartCount == 1 })
		// The hub's polls and the agent's resyncs of the same annotation
		// value must not restart again: watch several of each go by.
		h.never(t, "sample-vm", 4*resyncEvery, func(vm *v1alpha1.VirtualMachine) bool { return vm.Status.AtProvider.RestartCount != 1 },
			"a poll or resync restarted the VM again")
	})

	t.Run("SpecChangeWhileRunningSetsRestartRequired", func(t *testing.T) {
		// A swap disk is added only at a start: vCPUs and memory within the
		// guest's maximum would change live.
		h.patch(t, "sample-vm", func(vm *v1alpha1.VirtualMachine) { vm.Spec.ForProvider.Swap = ptr(resource.MustParse("512Mi")) })
		vm := h.wait(t, "sample-vm", 30*time.Second, func(vm *v1alpha1.VirtualMachine) bool {
			return vm.GetCondition("RestartRequired").Status == corev1.ConditionTrue
		})
		assert.Equal(t, v1alpha1.PhaseRunning, vm.Status.AtProvider.Phase, "the VM keeps running")
		assert.True(t, vm.Status.AtProvider.RestartRequired)
	})

	t.Run("ADetachedDiskStaysInStatusUntilTheGuestLetsItGo", func(t *testing.T) {
		// libvirt's test driver detaches no disk from a running guest: the
		// guest holds a removed disk until its next start.
		h.create(t, volume("holder-root"))
		h.create(t, volume("holder-data"))
		vm := vmWith("holder", "holder-root")
		vm.Spec.ForProvider.DiskAttachments = append(vm.Spec.ForProvider.DiskAttachments, v1alpha1.DiskAttachment{Name: "holder-data"})
		h.create(t, vm)
		vm = h.wait(t, "holder", 30*time.Second, running)
		assert.Equal(t, []string{"holder-root", "holder-data"}, vm.Status.AtProvider.Disks)
		h.patch(t, "holder", func(vm *v1alpha1.VirtualMachine) {
			vm.Spec.ForProvider.DiskAttachments = vm.Spec.ForProvider.DiskAttachments[:1]
		})
		vm = h.wait(t, "holder", 30*time.Second, func(vm *v1alpha1.VirtualMachine) bool {
			return vm.Status.AtProvider.ObservedGeneration == vm.Generation && vm.Status.AtProvider.RestartRequired
		})
		assert.Equal(t, []string{"holder-root", "holder-data"}, vm.Status.AtProvider.Disks, "the guest still holds the disk")

		// The disk the guest holds is not deleted under it: its Volume
		// stays, in use by the VM, until the guest lets it go.
		data := h.waitVolume(t, "holder-data", 30*time.Second, func(v *v1alpha1.Volume) bool { return v.Status.AtProvider.Node != "" })
		disk, node := ns+"_holder-data", data.Status.AtProvider.Node
		require.NoError(t, h.kube.Delete(context.Background(), data))
		h.waitVolume(t, "holder-data", 30*time.Second, func(v *v1alpha1.Volume) bool {
			return v.DeletionTimestamp != nil && v.GetCondition("InUse").Message == "used by VirtualMachine holder"
		})
		assert.Eventually(t, func() bool {
			return h.hasEvent(t, "holder-data", "DeletionBlocked", "Volume holder-data is used by VirtualMachine holder")
		}, 10*time.Second, 50*time.Millisecond, "the deletion is refused naming the VM")
		assert.True(t, h.nodeVolumeExists(t, node, disk), "the guest's disk is still on its node")

		h.patch(t, "holder", func(vm *v1alpha1.VirtualMachine) {
			vm.SetAnnotations(merge(vm.GetAnnotations(), v1alpha1.AnnotationRestartRequestedAt, time.Now().Format(time.RFC3339)))
		})
		vm = h.wait(t, "holder", 30*time.Second, func(vm *v1alpha1.VirtualMachine) bool {
			return vm.Status.AtProvider.RestartCount == 1 && running(vm) && !vm.Status.AtProvider.RestartRequired
		})
		assert.Equal(t, []string{"holder-root"}, vm.Status.AtProvider.Disks, "the restart let the disk go")
		require.Eventually(t, func() bool {
			return kerrors.IsNotFound(h.kube.Get(context.Background(), client.ObjectKeyFromObject(data), &v1alpha1.Volume{}))
		}, 30*time.Second, 100*time.Millisecond, "the Volume goes once the guest let its disk go")
		assert.False(t, h.nodeVolumeExists(t, node, disk), "with its disk")
	})

	t.Run("MissingVolumeWaitsThenRuns", func(t *testing.T) {
		h.create(t, vmWith("waits", "late-disk"))
		vm := h.wait(t, "waits", 30*time.Second, func(vm *v1alpha1.VirtualMachine) bool {
			return strings.Contains(vm.GetCondition(xpv2.TypeSynced).Message, "late-disk")
		})
		assert.Equal(t, v1alpha1.PhasePending, vm.Status.AtProvider.Phase)
		h.create(t, volume("late-disk"))
		h.wait(t, "waits", 30*time.Second, running)
	})

	t.Run("VolumeInUseCannotBeDeleted", func(t *testing.T) {
		v := &v1alpha1.Volume{}
		require.NoError(t, h.kube.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: "late-disk"}, v))
		require.NoError(t, h.kube.Delete(context.Background(), v))
		require.Eventually(t, func() bool {
			err := h.kube.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: "late-disk"}, v)
			return err == nil && v.GetCondition("InUse").Status == corev1.ConditionTrue && v.DeletionTimestamp != nil
		}, 20*time.Second, 200*time.Millisecond)
		assert.Never(t, func() bool {
			return kerrors.IsNotFound(h.kube.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: "late-disk"}, &v1alpha1.Volume{}))
		}, 2*time.Second, 200*time.Millisecond, "the Volume stays while the VM uses it")
	})

	t.Run("DeletingAVMKeepsItsVolumesAndNetworks", func(t *testing.T) {
		uid := string(h.get(t, "waits").UID)
		node := h.get(t, "waits").Status.AtProvider.Node
		h.delete(t, "waits")
		assert.Zero(t, h.domains(t, node)[uid], "the guest is deleted with the VM")
		for _, name := range []string{"net-db"} {
			assert.NoError(t, h.kube.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, &v1alpha1.VirtualNetwork{}))
		}
		// The Volume whose deletion was blocked goes now that nothing uses it.
		require.Eventually(t, func() bool {
			return kerrors.IsNotFound(h.kube.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: "late-disk"}, &v1alpha1.Volume{}))
		}, 30*time.Second, 200*time.Millisecond)
		for _, name := range []string{"sample-vm-root", "sample-vm-data", "sample-vm-logs"} {
			assert.NoError(t, h.kube.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, &v1alpha1.Volume{}))
		}
	})

	t.Run("Snapshots", func(t *testing.T) { testSnapshots(t, h) })

	t.Run("NodeLossShowsUnknownAndRecovers", func(t *testing.T) {
		node := h.get(t, "sample-vm").Status.AtProvider.Node
		s.KillAgent(node)
		start := time.Now()
		vm := h.wait(t, "sample-vm", time.Minute, phase(v1alpha1.PhaseUnknown))
		t.Logf("phase Unknown %s after the agent was killed", time.Since(start).Round(100*time.Millisecond))
		assert.Equal(t, corev1.ConditionTrue, vm.GetCondition("NodeLost").Status)
		require.NoError(t, s.StartAgent(node))
		vm = h.wait(t, "sample-vm", 30*time.Second, running)
		assert.Equal(t, corev1.ConditionFalse, vm.GetCondition("NodeLost").Status)
		assert.Equal(t, 1, h.domains(t, node)[string(vm.UID)], "no second guest after the node came back")
	})

	t.Run("DeleteOnALostNodeIsFinalizedAfterFencing", func(t *testing.T) {
		h.create(t, vmWith("fenced", "sample-vm-data"))
		vm := h.wait(t, "fenced", 30*time.Second, running)
		v := &v1alpha1.Volume{}
		require.NoError(t, h.kube.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: "sample-vm-data"}, v))
		assert.Equal(t, h.get(t, "sample-vm").Status.AtProvider.Node, v.Status.AtProvider.Node, "the volume is bound to its first VM's node")
		assert.Equal(t, v.Status.AtProvider.Node, vm.Status.AtProvider.Node, "a later VM using a bound volume is placed on its node")
		s.KillAgent(vm.Status.AtProvider.Node)
		h.wait(t, "fenced", 20*time.Second, phase(v1alpha1.PhaseUnknown))
		require.NoError(t, h.kube.Delete(context.Background(), vm))
		require.Eventually(t, func() bool {
			return kerrors.IsNotFound(h.kube.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: "fenced"}, &v1alpha1.VirtualMachine{}))
		}, 90*time.Second, 250*time.Millisecond, "a delete must never hang forever")
		h.assertEvent(t, "fenced", "NodeLost", "fencing timeout")
		require.NoError(t, s.StartAgent(vm.Status.AtProvider.Node))
	})

	t.Run("HubKilledMidBurstLeavesExactlyOneGuestPerVM", func(t *testing.T) {
		const n = 50
		for i := range n {
			h.create(t, volume(fmt.Sprintf("burst-%02d", i)))
		}
		for i := range n {
			h.create(t, vmWith(fmt.Sprintf("burst-%02d", i), fmt.Sprintf("burst-%02d", i)))
			if i == n/2 {
				s.KillHub()
				require.NoError(t, s.StartHub())
			}
		}
		uids := map[string]bool{}
		for i := range n {
			vm := h.wait(t, fmt.Sprintf("burst-%02d", i), 120*time.Second, running)
			uids[string(vm.UID)] = true
		}
		total := 0
		for _, node := range []string{"node1", "node2", "node3"} {
			for uid, count := range h.domains(t, node) {
				if uids[uid] {
					assert.Equal(t, 1, count, "guest %s defined twice on %s", uid, node)
					total += count
				}
			}
		}
		assert.Equal(t, n, total, "exactly one guest per VM across the fleet")
	})
}

// startStack starts the whole system for one test in a runDir and stops it
// at the end. VIRTFLEET_DEBUG=1 makes the hub and agents log at debug level.
func startStack(t *testing.T, prefix string, o stack.Options) *hub {
	t.Helper()
	if usesCloud(o) {
		holdCloud(t)
	} else {
		takeSlot(t)
	}
	o.Dir, o.Debug = runDir(t, prefix), os.Getenv("VIRTFLEET_DEBUG") != ""
	if o.Binaries == "" {
		o.Binaries = sharedBinaries(t)
	}
	s, err := stack.Start(context.Background(), o)
	require.NoError(t, err)
	// Cleanups run last first: the stack stops before its directory goes.
	t.Cleanup(s.Stop)
	return &hub{t: t, s: s, kube: s.ControlPlane.Client}
}

// runDir is a directory for one test's whole system, removed at the end
// unless the test failed, when its logs are kept and named. Not t.TempDir:
// sockets want a short path, and a failure wants the logs.
func runDir(t *testing.T, prefix string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", prefix)
	require.NoError(t, err)
	t.Cleanup(func() {
		if !t.Failed() {
			_ = os.RemoveAll(dir)
		} else {
			t.Logf("logs kept in %s", filepath.Join(dir, "logs"))
		}
	})
	return dir
}

type hub struct {
	t    *testing.T
	s    *stack.Stack
	kube client.Client
}

func (h *hub) get(t *testing.T, name string) *v1alpha1.VirtualMachine {
	t.Helper()
	return getInto(t, h, name, &v1alpha1.VirtualMachine{})
}

// getInto reads the object name of ns into o.
func getInto[T client.Object](t *testing.T, h *hub, name string, o T) T {
	t.Helper()
	require.NoError(t, h.kube.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, o))
	return o
}

// never reads VM name for d and fails t if bad holds at any read, or the VM
// cannot be read: what must not happen is watched for all of d, not
// looked for once at its end.
func (h *hub) never(t *testing.T, name string, d time.Duration, bad func(*v1alpha1.VirtualMachine) bool, msg string) {
	t.Helper()
	assert.Never(t, func() bool {
		vm := &v1alpha1.VirtualMachine{}
		err := h.kube.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, vm)
		return err != nil || bad(vm)
	}, d, 100*time.Millisecond, "%s (or VM %s could not be read)", msg, name)
}

// wait polls the API, as kubectl get -w would, until ok holds.
func (h *hub) wait(t *testing.T, name string, timeout time.Duration, ok func(*v1alpha1.VirtualMachine) bool) *v1alpha1.VirtualMachine {
	t.Helper()
	var last *v1alpha1.VirtualMachine
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		vm := &v1alpha1.VirtualMachine{}
		if err := h.kube.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, vm); err == nil {
			last = vm
			if ok(vm) {
				return vm
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	if last != nil {
		t.Fatalf("VM %s: condition not met within %s; status %+v, conditions %+v", name, timeout, last.Status.AtProvider, last.Status.Conditions)
	}
	t.Fatalf("VM %s not found within %s", name, timeout)
	return nil
}

func (h *hub) patch(t *testing.T, name string, change func(*v1alpha1.VirtualMachine)) {
	t.Helper()
	vm := h.get(t, name)
	p := client.MergeFrom(vm.DeepCopy())
	change(vm)
	require.NoError(t, h.kube.Patch(context.Background(), vm, p))
}

// waitMigration polls the migration name until it is over.
func (h *hub) waitMigration(t *testing.T, name string, timeout time.Duration) *v1alpha1.VirtualMachineMigration {
	t.Helper()
	m := &v1alpha1.VirtualMachineMigration{}
	require.Eventually(t, func() bool {
		return h.kube.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, m) == nil && m.Done()
	}, timeout, 100*time.Millisecond, "migration %s: last status %+v", name, &m.Status)
	return m
}

func (h *hub) create(t *testing.T, o client.Object) {
	t.Helper()
	require.NoError(t, h.kube.Create(context.Background(), o))
}

// delete deletes a VM and waits until the hub finalized it.
func (h *hub) delete(t *testing.T, name string) {
	t.Helper()
	h.deleteObject(t, h.get(t, name))
}

// domains counts the node's guests by virtfleet uid, behind virtfleet's back.
func (h *hub) domains(t *testing.T, node string) map[string]int {
	t.Helper()
	g, err := h.s.Guests(context.Background(), node)
	require.NoError(t, err)
	return g
}

// assertEvent checks that name gets an event of reason whose message holds
// text. Events are posted after the reconcile that records them, and
// asynchronously: a check right after the change would race them.
func (h *hub) assertEvent(t *testing.T, name, reason, text string) {
	t.Helper()
	assert.Eventually(t, func() bool { return h.hasEvent(t, name, reason, text) }, 10*time.Second, 50*time.Millisecond,
		"an event %s on %s saying %q", reason, name, text)
}

// hasEvent is the condition of assertEvent and of other waits: it runs on
// Eventually's goroutine, where a failed List is logged and looked at
// again, not a FailNow.
func (h *hub) hasEvent(t *testing.T, name, reason, text string) bool {
	t.Helper()
	return h.hasEventIn(t, ns, name, func(e corev1.Event) bool { return e.Reason == reason && strings.Contains(e.Message, text) })
}

// hasEventIn says whether the object name of namespace has an event that
// matches.
func (h *hub) hasEventIn(t *testing.T, namespace, name string, matches func(corev1.Event) bool) bool {
	t.Helper()
	l := &corev1.EventList{}
	if err := h.kube.List(context.Background(), l, client.InNamespace(namespace)); err != nil {
		t.Logf("cannot list events: %v", err)
		return false
	}
	for _, e := range l.Items {
		if e.InvolvedObject.Name == name && matches(e) {
			return true
		}
	}
	return false
}

func running(vm *v1alpha1.VirtualMachine) bool {
	return vm.Status.AtProvider.Phase == v1alpha1.PhaseRunning && vm.GetCondition(xpv2.TypeReady).Status == corev1.ConditionTrue
}

func phase(p v1alpha1.Phase) func(*v1alpha1.VirtualMachine) bool {
	return func(vm *v1alpha1.VirtualMachine) bool { return vm.Status.AtProvider.Phase == p }
}

// vmWith is a small VM on net-db that boots from the named volume.
func vmWith(name, disk string) *v1alpha1.VirtualMachine {
	return &v1alpha1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1alpha1.VirtualMachineSpec{ForProvider: v1alpha1.VirtualMachineParameters{
			Vcpu:            1,
			Memory:          resource.MustParse("128Mi"),
			VirtualNetworks: []v1alpha1.LocalName{"net-db"},
			DiskAttachments: []v1alpha1.DiskAttachment{{Name: v1alpha1.LocalName(disk)}},
		}},
	}
}

func volume(name string) *v1alpha1.Volume {
	return &v1alpha1.Volume{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       v1alpha1.VolumeSpec{ForProvider: v1alpha1.VolumeParameters{Size: resource.MustParse("1Gi")}},
	}
}

func merge(m map[string]string, k, v string) map[string]string {
	if m == nil {
		m = map[string]string{}
	}
	m[k] = v
	return m
}

func ptr[T any](v T) *T { return &v }
