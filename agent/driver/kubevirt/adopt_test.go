package kubevirt

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/internal/harness/kubevirttest"
)

// read reads the object named name of the test's namespace into obj, or
// returns nil when there is none.
func read[T client.Object](e *env, name string, obj T) T {
	e.t.Helper()
	err := e.kube.Get(context.Background(), types.NamespacedName{Namespace: e.ns, Name: name}, obj)
	if kerrors.IsNotFound(err) {
		var none T
		return none
	}
	require.NoError(e.t, err)
	return obj
}

// byName reads the KubeVirt VM named name, or nil.
func (e *env) byName(name string) *kubevirtv1.VirtualMachine {
	e.t.Helper()
	return read(e, name, &kubevirtv1.VirtualMachine{})
}

// instanceOf reads the VMI of the KubeVirt VM named name, or nil.
func (e *env) instanceOf(name string) *kubevirtv1.VirtualMachineInstance {
	e.t.Helper()
	return read(e, name, &kubevirtv1.VirtualMachineInstance{})
}

// handMade creates vm behind virtfleet's back and waits until KubeVirt
// runs it and says so in the VM's status.
func (e *env) handMade(vm *kubevirtv1.VirtualMachine) *kubevirtv1.VirtualMachine {
	e.t.Helper()
	require.NoError(e.t, e.kube.Create(context.Background(), vm))
	require.Eventually(e.t, func() bool {
		got := e.byName(vm.Name)
		return got.Status.PrintableStatus == kubevirtv1.VirtualMachineStatusRunning && got.Status.Ready
	}, 20*time.Second, 50*time.Millisecond, "KubeVirt runs %s", vm.Name)
	return e.byName(vm.Name)
}

func specJSON(t *testing.T, vm *kubevirtv1.VirtualMachine) string {
	t.Helper()
	b, err := json.Marshal(vm.Spec.Template)
	require.NoError(t, err)
	return string(b)
}

func TestReleaseAndAdopt(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	old := e.machine()
	old.RestartNonce = "first"
	e.ensureUntil(old, phaseIs(driver.PhaseRunning))
	old.RestartNonce = "second"
	before := e.ensureUntil(old, func(o driver.Observation) bool {
		return o.Phase == driver.PhaseRunning && o.RestartCount == 1 && len(o.Interfaces) == 1
	})
	name := VMName(old.UID)
	vmi := e.instanceOf(name).UID

	require.NoError(t, e.d.Release(ctx, old.UID, "the-seal"))
	require.NoError(t, e.d.Release(ctx, old.UID, "the-seal"), "releasing twice succeeds")
	require.NoError(t, e.d.Delete(ctx, old.UID), "Delete leaves a released guest alone")
	released := e.byName(name)
	require.NotNil(t, released, "the VM stays")
	assert.Equal(t, "true", released.Labels[LabelOrphaned])
	assert.Equal(t, kubevirtv1.RunStrategyAlways, *released.Spec.RunStrategy, "not stopped")
	assert.Equal(t, vmi, e.instanceOf(name).UID, "the same VMI runs on")
	_, err := e.d.Observe(ctx, old.UID)
	assert.True(t, driver.IsNotFound(err), "a released guest is no longer the uid's: %v", err)
	_, err = e.d.Ensure(ctx, old)
	assert.True(t, driver.IsTerminal(err), "nor does Ensure take it back: %v", err)
	list, err := e.d.List(ctx)
	require.NoError(t, err)
	assert.Empty(t, list, "List does not report orphans")
	c, err := e.d.Capacity(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(old.VCPU), c.AllocatedVCPU, "an orphan runs on in the cluster and still holds its share")
	var orphans []driver.Observation
	require.Eventually(t, func() bool {
		orphans, err = e.d.Orphans(ctx)
		return err == nil && len(orphans) == 1
	}, 5*time.Second, 20*time.Millisecond, "%v %v", orphans, err)
	assert.Equal(t, old.UID, orphans[0].UID)
	assert.Equal(t, &driver.VMRef{Namespace: old.Namespace, Name: old.Name, Seal: "the-seal"}, orphans[0].OrphanOf, "the orphan keeps its seal")
	assert.Equal(t, driver.PhaseRunning, orphans[0].Phase)

	next := old
	next.UID = string(uuid.NewUUID())
	require.NoError(t, e.d.Claim(ctx, next, driver.Ref{Orphan: old.UID}))
	require.NoError(t, e.d.Claim(ctx, next, driver.Ref{Orphan: old.UID}), "claiming again succeeds")
	o, err := e.d.Ensure(ctx, next)
	require.NoError(t, err)
	assert.Equal(t, driver.PhaseRunning, o.Phase)
	assert.Equal(t, before.ID, o.ID, "the same KubeVirt VM")
	assert.Equal(t, before.Interfaces[0].IPs, o.Interfaces[0].IPs, "the same addresses")
	assert.Equal(t, int32(1), o.RestartCount, "the restart count carries on")
	assert.False(t, o.RestartRequired, "the same spec needs no restart")
	assert.Equal(t, vmi, e.instanceOf(name).UID, "not restarted")
	assert.Equal(t, 1, e.guests(next.UID))
	assert.Zero(t, e.guests(old.UID))
	assert.NotContains(t, e.byName(name).Annotations, AnnotationImported, "adopted by its own name: driven as if made for it")
	require.Eventually(t, func() bool {
		orphans, err = e.d.Orphans(ctx)
		return err == nil && len(orphans) == 0
	}, 5*time.Second, 20*time.Millisecond, "%v %v", orphans, err)

	t.Run("ANewDriverFindsTheAdoptedGuest", func(t *testing.T) {
		list, err := e.open().List(ctx)
		require.NoError(t, err)
		require.Len(t, list, 1)
		assert.Equal(t, next.UID, list[0].UID)
	})
	t.Run("TheOldUIDsDeleteLeavesIt", func(t *testing.T) {
		require.NoError(t, e.d.Delete(ctx, old.UID))
		assert.NotNil(t, e.byName(name))
	})
	t.Run("EventsNameTheNewOwner", func(t *testing.T) {
		drain(e.d.Events())
		require.NoError(t, cluster.Controller.Crash(ctx, types.NamespacedName{Namespace: e.ns, Name: name}))
		timeout := time.After(10 * time.Second)
		for {
			select {
			case ev := <-e.d.Events():
				assert.NotEqual(t, old.UID, ev.UID, "the VMI still carries the old uid, its hints do not")
				if ev.UID == next.UID && ev.Kind == driver.EventCrashed {
					return
				}
			case <-timeout:
				t.Fatal("no Crashed event for the new owner")
			}
		}
	})
	t.Run("ADifferentSpecShowsRestartRequired", func(t *testing.T) {
		// The crash above has KubeVirt start a new VMI from the template;
		// changed before that VMI exists, the template would start it
		// with the new shape.
		e.ensureUntil(next, phaseIs(driver.PhaseRunning))
		changed := next
		changed.SwapBytes = 1 << 30
		before := e.instanceOf(name)
		o := e.ensureUntil(changed, phaseIs(driver.PhaseRunning))
		assert.True(t, o.RestartRequired)
		assert.Equal(t, before.Spec.Volumes, e.instanceOf(name).Spec.Volumes, "the running guest is untouched")
	})
	t.Run("DeleteOfTheNewOwnerDeletesIt", func(t *testing.T) {
		require.Eventually(t, func() bool { return e.d.Delete(ctx, next.UID) == nil }, 10*time.Second, 50*time.Millisecond)
		assert.Nil(t, e.byName(name))
	})
}

// TestImport takes over VMs a KubeVirt user made, as they write them.
func TestImport(t *testing.T) {
	cases := map[string]func(*kubevirtv1.VirtualMachine){
		"RunStrategyAlways": func(*kubevirtv1.VirtualMachine) {},
		"DeprecatedRunning": func(vm *kubevirtv1.VirtualMachine) {
			vm.Spec.RunStrategy, vm.Spec.Running = nil, ptr(true) //nolint:staticcheck // what older manifests say
		},
		"RerunOnFailure": func(vm *kubevirtv1.VirtualMachine) { vm.Spec.RunStrategy = ptr(kubevirtv1.RunStrategyRerunOnFailure) },
	}
	for name, change := range cases {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			e := newEnv(t)
			m := e.machine()
			vm := kubevirttest.HandMadeVM(e.ns, "made-by-hand", ObjectName(m.Networks[0].Name))
			change(vm)
			vm = e.handMade(vm)
			template := specJSON(t, vm)
			first := e.instanceOf(vm.Name).UID

			for _, ref := range []driver.Ref{{ExternalName: vm.Name}, {ExternalName: string(vm.UID)}} {
				o, err := e.d.ObserveRef(ctx, ref)
				require.NoError(t, err, ref)
				assert.Equal(t, driver.PhaseRunning, o.Phase, ref)
				assert.Equal(t, string(vm.UID), o.ID, ref)
				assert.Equal(t, int32(1), o.VCPU, "its real vCPUs")
				assert.Equal(t, int64(128<<20), o.MemoryBytes, "its memory request")
				assert.Contains(t, []string{"kv-node-a", "kv-node-b"}, o.Node)
				require.Len(t, o.Interfaces, 1)
				assert.NotEmpty(t, o.Interfaces[0].IPs)
			}
			assert.Equal(t, vm.ResourceVersion, e.byName(vm.Name).ResourceVersion, "ObserveRef changes nothing")
			list, err := e.d.List(ctx)
			require.NoError(t, err)
			assert.Empty(t, list, "a guest observed is not the driver's")

			require.NoError(t, e.d.Claim(ctx, m, driver.Ref{ExternalName: vm.Name}))
			require.NoError(t, e.d.Claim(ctx, m, driver.Ref{ExternalName: vm.Name}), "claiming again succeeds")
			o := e.ensureUntil(m, phaseIs(driver.PhaseRunning))
			assert.Equal(t, string(vm.UID), o.ID)
			assert.Equal(t, int32(1), o.VCPU, "an imported guest keeps its shape")
			assert.False(t, o.RestartRequired, "its shape is its own")
			got := e.byName(vm.Name)
			assert.Equal(t, m.UID, got.Labels[LabelUID])
			assert.Equal(t, "true", got.Annotations[AnnotationImported])
			assert.Equal(t, template, specJSON(t, got), "the definition is never rewritten")
			assert.Equal(t, first, e.instanceOf(vm.Name).UID, "nor restarted")
			assert.Equal(t, 1, e.guests(m.UID))
			assert.Nil(t, e.byName(VMName(m.UID)), "no VM made")

			m.Running = false
			o = e.ensureUntil(m, phaseIs(driver.PhaseStopped))
			assert.Zero(t, o.RestartCount, "a stop is no restart")
			got = e.byName(vm.Name)
			assert.Equal(t, kubevirtv1.RunStrategyHalted, *got.Spec.RunStrategy, "its power state is driven")
			assert.Nil(t, got.Spec.Running, "KubeVirt takes runStrategy or running, not both") //nolint:staticcheck // see above
			assert.Equal(t, template, specJSON(t, got))
			m.Running = true
			o = e.ensureUntil(m, phaseIs(driver.PhaseRunning))
			assert.Zero(t, o.RestartCount, "a start is no restart")
			m.RestartNonce = "now"
			_, err = e.d.Ensure(ctx, m)
			require.NoError(t, err)
			o = e.ensureUntil(m, func(o driver.Observation) bool { return o.Phase == driver.PhaseRunning && o.RestartCount == 1 })
			assert.Equal(t, template, specJSON(t, e.byName(vm.Name)), "a restart rewrites nothing either")

			require.Eventually(t, func() bool { return e.d.Delete(ctx, m.UID) == nil }, 10*time.Second, 50*time.Millisecond)
			assert.Nil(t, e.byName(vm.Name), "its VM deletes an imported guest")
		})
	}
}

// TestClaimRefusals: a guest has one VM, and a claim of nothing finds
// nothing.
func TestClaimRefusals(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	owner := e.machine()
	e.ensureUntil(owner, phaseIs(driver.PhaseRunning))
	id := string(e.vm(owner.UID).UID)

	cases := map[string]struct {
		ref  driver.Ref
		want func(error) bool
		msg  string
	}{
		"ManagedByName":      {driver.Ref{ExternalName: VMName(owner.UID)}, driver.IsTerminal, "VirtualMachine " + owner.Namespace + "/" + owner.Name},
		"ManagedByID":        {driver.Ref{ExternalName: id}, driver.IsTerminal, "VirtualMachine " + owner.Namespace + "/" + owner.Name},
		"NotAnOrphan":        {driver.Ref{Orphan: owner.UID}, driver.IsNotFound, "no orphan"},
		"NoSuchName":         {driver.Ref{ExternalName: "nothing-here"}, driver.IsNotFound, "nothing-here"},
		"NoSuchID":           {driver.Ref{ExternalName: string(uuid.NewUUID())}, driver.IsNotFound, "no KubeVirt VirtualMachine"},
		"NotAKubernetesName": {driver.Ref{ExternalName: "Not a/name"}, driver.IsNotFound, "no KubeVirt VirtualMachine"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			m := e.machine()
			err := e.d.Claim(ctx, m, tc.ref)
			require.Error(t, err)
			assert.True(t, tc.want(err), "%v", err)
			assert.Contains(t, err.Error(), tc.msg)
			_, err = e.d.Observe(ctx, m.UID)
			assert.True(t, driver.IsNotFound(err), "the claim took nothing: %v", err)
		})
	}
	assert.Equal(t, 1, e.guests(owner.UID), "the owner keeps its guest")
	_, err := e.d.ObserveRef(ctx, driver.Ref{ExternalName: "nothing-here"})
	assert.True(t, driver.IsNotFound(err), "%v", err)
}

// staleReads answers reads from what the informers held at one moment,
// as informers lagging behind a write do.
type staleReads struct {
	client.Client
	vms kubevirtv1.VirtualMachineList
}

func (s *staleReads) List(_ context.Context, list client.ObjectList, _ ...client.ListOption) error {
	if vms, ok := list.(*kubevirtv1.VirtualMachineList); ok {
		s.vms.DeepCopyInto(vms)
	}
	return nil
}

func (s *staleReads) Get(_ context.Context, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	for i := range s.vms.Items {
		if vm, ok := obj.(*kubevirtv1.VirtualMachine); ok && s.vms.Items[i].Name == key.Name {
			s.vms.Items[i].DeepCopyInto(vm)
			return nil
		}
	}
	return kerrors.NewNotFound(kubevirtv1.Resource("virtualmachines"), key.Name)
}

// releasedBehindInformers runs a guest, releases it with the seal
// "the-seal", and leaves the driver reading what its informers held before
// the release.
func releasedBehindInformers(t *testing.T, e *env) driver.Machine {
	t.Helper()
	ctx := context.Background()
	m := e.machine()
	e.ensureUntil(m, phaseIs(driver.PhaseRunning))
	before := &staleReads{}
	require.NoError(t, e.kube.List(ctx, &before.vms, client.InNamespace(e.ns)))
	require.Len(t, before.vms.Items, 1)
	require.NoError(t, e.d.Release(ctx, m.UID, "the-seal"))
	e.d.mu.Lock()
	before.Client = e.d.conn.client
	e.d.conn.client = before
	e.d.mu.Unlock()
	return m
}

// TestDeleteAfterReleaseWithLaggingInformers deletes a guest released a
// moment ago while the informers still show it managed: the orphan stays.
func TestDeleteAfterReleaseWithLaggingInformers(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	m := releasedBehindInformers(t, e)
	require.NoError(t, e.d.Delete(ctx, m.UID))

	left := e.byName(VMName(m.UID))
	require.NotNil(t, left, "the orphan stays")
	assert.Nil(t, left.DeletionTimestamp, "and is not being deleted")
	assert.Equal(t, "true", left.Labels[LabelOrphaned])
}

// TestOrphansRightAfterReleaseWithLaggingInformers lists the orphans a
// moment after a release, while the informers still show the guest
// managed: the orphan is listed, so its report is kept.
func TestOrphansRightAfterReleaseWithLaggingInformers(t *testing.T) {
	e := newEnv(t)
	m := releasedBehindInformers(t, e)
	orphans, err := e.d.Orphans(context.Background())
	require.NoError(t, err)
	require.Len(t, orphans, 1, "the guest released a moment ago")
	assert.Equal(t, m.UID, orphans[0].UID)
	require.NotNil(t, orphans[0].OrphanOf)
	assert.Equal(t, "the-seal", orphans[0].OrphanOf.Seal)
}
