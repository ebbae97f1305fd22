package kubevirt

import (
	"context"
	"encoding/json"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/rest"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/internal/harness/kubevirttest"
)

// env is one test's view of the shared cluster: a namespace of its own and
// a driver for it.
type env struct {
	t    *testing.T
	ns   string
	kube client.Client
	d    *Driver
}

func newEnv(t *testing.T) *env {
	t.Helper()
	if testing.Short() {
		t.Skip("needs the KubeVirt test cluster; skipped with -short")
	}
	ns := strings.ToLower("t-" + string(uuid.NewUUID())[:8])
	require.NoError(t, cluster.Client.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}))
	e := &env{t: t, ns: ns, kube: cluster.Client}
	e.d = e.open()
	return e
}

func (e *env) open() *Driver {
	e.t.Helper()
	d, err := Open(context.Background(), Config{Kubeconfig: cluster.Kubeconfig, Namespace: e.ns})
	require.NoError(e.t, err)
	e.t.Cleanup(func() { _ = d.Close() })
	return d
}

func (e *env) machine() driver.Machine {
	m := testMachine(string(uuid.NewUUID()))
	m.Namespace, m.Name = e.ns, "vm-"+m.UID[:8]
	m.Disks = []driver.Disk{{Name: m.Namespace + "_" + m.Name + "-root", SizeBytes: 1 << 30}}
	m.Networks = []driver.Network{{Name: m.Namespace + "_net-db"}}
	return m
}

// ensureUntil calls Ensure as the reconciler would until the observation
// satisfies done.
func (e *env) ensureUntil(m driver.Machine, done func(driver.Observation) bool) driver.Observation {
	e.t.Helper()
	var last driver.Observation
	var lastErr error
	require.Eventually(e.t, func() bool {
		last, lastErr = e.d.Ensure(context.Background(), m)
		return lastErr == nil && done(last)
	}, 20*time.Second, 50*time.Millisecond, "last observation %+v, error %v", &last, &lastErr)
	return last
}

func phaseIs(p driver.Phase) func(driver.Observation) bool {
	return func(o driver.Observation) bool { return o.Phase == p }
}

func (e *env) vm(uid string) *kubevirtv1.VirtualMachine {
	e.t.Helper()
	vm := &kubevirtv1.VirtualMachine{}
	require.NoError(e.t, e.kube.Get(context.Background(), types.NamespacedName{Namespace: e.ns, Name: VMName(uid)}, vm))
	return vm
}

func (e *env) vmi(uid string) *kubevirtv1.VirtualMachineInstance {
	e.t.Helper()
	return e.instanceOf(VMName(uid))
}

func (e *env) guests(uid string) int {
	e.t.Helper()
	vms := &kubevirtv1.VirtualMachineList{}
	require.NoError(e.t, e.kube.List(context.Background(), vms, client.InNamespace(e.ns), client.MatchingLabels{LabelUID: uid}))
	return len(vms.Items)
}

func TestCreateRunsTheGuestOnKubeVirt(t *testing.T) {
	e := newEnv(t)
	m := e.machine()
	o, err := e.d.Ensure(context.Background(), m)
	require.NoError(t, err)
	assert.Equal(t, driver.PhaseStarting, o.Phase, "Ensure does not wait for the guest")

	o = e.ensureUntil(m, phaseIs(driver.PhaseRunning))
	vm := e.vm(m.UID)
	assert.Equal(t, string(vm.UID), o.ID, "the id is the KubeVirt VM's uid")
	assert.Contains(t, []string{"kv-node-a", "kv-node-b"}, o.Node, "a schedulable Ready node")
	require.Len(t, o.Interfaces, 1)
	i := o.Interfaces[0]
	assert.Equal(t, m.Networks[0].Name, i.Network, "reported under the Machine's network name")
	assert.NotEmpty(t, i.MAC)
	assert.Len(t, i.IPs, 1)
	assert.Equal(t, driver.AddressSourceGuestAgent, i.Source)
	assert.Zero(t, o.RestartCount)
	assert.False(t, o.RestartRequired)

	want, err := newVM(m, e.ns, nil)
	require.NoError(t, err)
	wantJSON, err := json.Marshal(want.Spec)
	require.NoError(t, err)
	gotJSON, err := json.Marshal(vm.Spec)
	require.NoError(t, err)
	assert.JSONEq(t, string(wantJSON), string(gotJSON), "the API server keeps every field the driver writes")
	assert.Equal(t, m.Namespace, vm.Annotations[AnnotationNamespace])
	pvc := &corev1.PersistentVolumeClaim{}
	require.NoError(t, e.kube.Get(context.Background(), types.NamespacedName{Namespace: e.ns, Name: ObjectName(m.Disks[0].Name)}, pvc))
	assert.Equal(t, int64(1<<30), pvc.Spec.Resources.Requests.Storage().Value(), "a missing PVC is made with the disk's size")

	got, err := e.d.Observe(context.Background(), m.UID)
	require.NoError(t, err)
	assert.Equal(t, driver.PhaseRunning, got.Phase)
	list, err := e.d.List(context.Background())
	require.NoError(t, err)
	require.Len(t, list, 1)
	assert.Equal(t, m.UID, list[0].UID)
	_, err = e.d.Observe(context.Background(), string(uuid.NewUUID()))
	assert.True(t, driver.IsNotFound(err), "an unknown uid is not found: %v", err)
}

func TestStopAndStart(t *testing.T) {
	e := newEnv(t)
	m := e.machine()
	e.ensureUntil(m, phaseIs(driver.PhaseRunning))
	first := e.vmi(m.UID).UID

	m.Running = false
	o := e.ensureUntil(m, phaseIs(driver.PhaseStopped))
	assert.Empty(t, o.Interfaces)
	assert.Nil(t, e.vmi(m.UID), "KubeVirt removed the VMI")
	assert.Equal(t, kubevirtv1.RunStrategyHalted, *e.vm(m.UID).Spec.RunStrategy)

	m.Running = true
	o = e.ensureUntil(m, phaseIs(driver.PhaseRunning))
	assert.NotEqual(t, first, e.vmi(m.UID).UID, "a new VMI")
	assert.Zero(t, o.RestartCount, "a stop and a start are not a restart")
}

func TestRestart(t *testing.T) {
	e := newEnv(t)
	m := e.machine()
	m.RestartNonce = "created-with"
	e.ensureUntil(m, phaseIs(driver.PhaseRunning))
	first := e.vmi(m.UID).UID
	o := e.ensureUntil(m, phaseIs(driver.PhaseRunning))
	assert.Zero(t, o.RestartCount, "the nonce a guest is created with counts as handled")
	assert.Equal(t, first, e.vmi(m.UID).UID)

	m.RestartNonce = "2026-11-01T12:00:00Z"
	o, err := e.d.Ensure(context.Background(), m)
	require.NoError(t, err)
	assert.Equal(t, int32(1), o.RestartCount)
	o = e.ensureUntil(m, func(o driver.Observation) bool {
		vmi := e.vmi(m.UID)
		return o.Phase == driver.PhaseRunning && vmi != nil && vmi.UID != first
	})
	assert.Equal(t, int32(1), o.RestartCount, "one restart per nonce, however often Ensure is called")

	second := e.vmi(m.UID).UID
	d2 := e.open()
	o, err = d2.Ensure(context.Background(), m)
	require.NoError(t, err)
	assert.Equal(t, int32(1), o.RestartCount, "a new driver knows the nonce was handled")
	assert.Equal(t, second, e.vmi(m.UID).UID, "and does not restart again")

	require.NoError(t, cluster.Controller.Crash(context.Background(), types.NamespacedName{Namespace: e.ns, Name: VMName(m.UID)}))
	o = e.ensureUntil(m, func(o driver.Observation) bool { return o.Phase == driver.PhaseRunning && o.RestartCount == 2 })
	assert.NotEqual(t, second, e.vmi(m.UID).UID, "KubeVirt recreated the crashed VMI, counted as a restart")
}

// TestPause pauses and unpauses a guest through KubeVirt's pause and
// unpause subresources, which the test cluster serves as virt-api does,
// through the API server.
func TestPause(t *testing.T) {
	e := newEnv(t)
	m := e.machine()
	e.ensureUntil(m, phaseIs(driver.PhaseRunning))
	first := e.vmi(m.UID).UID

	m.Paused = true
	o, err := e.d.Ensure(context.Background(), m)
	require.NoError(t, err)
	assert.Equal(t, driver.PhasePaused, o.Phase, "paused once virt-api answered")
	assert.True(t, kubevirttest.IsPaused(e.vmi(m.UID)), "the VMI has the condition Paused")
	// The informers catch up; Ensure again must not ask for a second pause,
	// which virt-api refuses.
	o = e.ensureUntil(m, func(driver.Observation) bool {
		got, err := e.d.Observe(context.Background(), m.UID)
		return err == nil && got.Phase == driver.PhasePaused
	})
	assert.Equal(t, driver.PhasePaused, o.Phase)
	require.Len(t, o.Interfaces, 1)
	assert.NotEmpty(t, o.Interfaces[0].IPs, "a paused guest keeps its address")
	assert.Equal(t, first, e.vmi(m.UID).UID, "the same VMI, paused")

	m.Paused = false
	e.ensureUntil(m, phaseIs(driver.PhaseRunning))
	assert.False(t, kubevirttest.IsPaused(e.vmi(m.UID)), "unpaused")
	assert.Equal(t, first, e.vmi(m.UID).UID)

	m.Paused = true
	e.ensureUntil(m, phaseIs(driver.PhasePaused))
	m.Running = false
	e.ensureUntil(m, phaseIs(driver.PhaseStopped))
	assert.Nil(t, e.vmi(m.UID), "running false wins: KubeVirt removed the VMI")

	m.Running = true
	o = e.ensureUntil(m, func(o driver.Observation) bool {
		vmi := e.vmi(m.UID)
		return o.Phase == driver.PhasePaused && vmi != nil && kubevirttest.IsPaused(vmi)
	})
	assert.Zero(t, o.RestartCount, "a guest started paused runs, then is paused")
}

// TestReset: kubevirt.io/api has no reset of a VMI in place, so a reset is
// a restart whose VMI is deleted without a grace period.
func TestReset(t *testing.T) {
	e := newEnv(t)
	m := e.machine()
	m.ResetNonce = "created-with"
	e.ensureUntil(m, phaseIs(driver.PhaseRunning))
	first := e.vmi(m.UID).UID
	o := e.ensureUntil(m, phaseIs(driver.PhaseRunning))
	assert.Zero(t, o.RestartCount, "the reset nonce a guest is created with counts as handled")

	m.ResetNonce = "r1"
	o, err := e.d.Ensure(context.Background(), m)
	require.NoError(t, err)
	assert.Equal(t, int32(1), o.RestartCount)
	o = e.ensureUntil(m, func(o driver.Observation) bool {
		vmi := e.vmi(m.UID)
		return o.Phase == driver.PhaseRunning && vmi != nil && vmi.UID != first
	})
	assert.Equal(t, int32(1), o.RestartCount, "one reset per nonce")
	second := e.vmi(m.UID).UID
	o, err = e.open().Ensure(context.Background(), m)
	require.NoError(t, err)
	assert.Equal(t, int32(1), o.RestartCount, "a new driver knows the nonce was handled")
	assert.Equal(t, second, e.vmi(m.UID).UID, "and does not reset again")

	m.ResetNonce = ""
	e.ensureUntil(m, phaseIs(driver.PhaseRunning))
	assert.Equal(t, second, e.vmi(m.UID).UID, "no nonce asks for nothing")
	m.ResetNonce = "r1"
	o = e.ensureUntil(m, func(o driver.Observation) bool {
		vmi := e.vmi(m.UID)
		return o.Phase == driver.PhaseRunning && vmi != nil && vmi.UID != second
	})
	assert.Equal(t, int32(2), o.RestartCount, "the last nonce asked for again resets again")
	third := e.vmi(m.UID).UID

	m.Paused = true
	e.ensureUntil(m, phaseIs(driver.PhasePaused))
	m.ResetNonce = "r2"
	o = e.ensureUntil(m, func(o driver.Observation) bool {
		vmi := e.vmi(m.UID)
		return o.Phase == driver.PhasePaused && vmi != nil && vmi.UID != third && kubevirttest.IsPaused(vmi)
	})
	assert.Equal(t, int32(3), o.RestartCount, "a paused guest is reset and paused again")
}

// TestACallOfTheSubresourceAPISaysWhatIsMissing: a VMI that is gone and an
// API the cluster does not serve (no virt-api) are told apart.
func TestACallOfTheSubresourceAPISaysWhatIsMissing(t *testing.T) {
	e := newEnv(t)
	gone := &kubevirtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: "gone"}}
	err := e.d.subresource(context.Background(), gone, "pause", &kubevirtv1.PauseOptions{})
	require.Error(t, err)
	assert.True(t, kerrors.IsNotFound(err), "virt-api's answer: %v", err)
	assert.NotContains(t, err.Error(), "serves no")

	sub := rest.CopyConfig(cluster.Config)
	sub.GroupVersion = &schema.GroupVersion{Group: "nothing." + kubevirtv1.SubresourceGroupName, Version: kubevirtv1.ApiLatestVersion}
	sub.APIPath = "/apis"
	sub.NegotiatedSerializer = serializer.NewCodecFactory(cluster.Scheme).WithoutConversion()
	rc, err := rest.RESTClientFor(sub)
	require.NoError(t, err)
	e.d.subresources = rc
	err = e.d.subresource(context.Background(), gone, "pause", &kubevirtv1.PauseOptions{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "the cluster serves no subresources.kubevirt.io/v1 API (KubeVirt's virt-api serves it)")
}

func TestShapeChangeNeedsARestart(t *testing.T) {
	e := newEnv(t)
	m := e.machine()
	e.ensureUntil(m, phaseIs(driver.PhaseRunning))

	m.SwapBytes = 1 << 30
	o, err := e.d.Ensure(context.Background(), m)
	require.NoError(t, err)
	assert.Equal(t, driver.PhaseRunning, o.Phase, "the running guest is left alone")
	assert.True(t, o.RestartRequired)
	before := e.vmi(m.UID)

	m.RestartNonce = "apply"
	o = e.ensureUntil(m, func(o driver.Observation) bool { return o.Phase == driver.PhaseRunning && !o.RestartRequired })
	after := e.vmi(m.UID)
	assert.NotEqual(t, before.UID, after.UID, "restarted")
	assert.Equal(t, e.vm(m.UID).Spec.Template.Spec.Volumes, after.Spec.Volumes, "the restart applied the new shape")
	assert.Equal(t, int32(1), o.RestartCount)
}

// TestHubAddressesReachTheGuest runs guests with and without addresses from
// the hub on the stand-in, which reports the address a guest configures
// from its network data, as KubeVirt's guest agent does, and a lease from
// the site's network otherwise.
func TestHubAddressesReachTheGuest(t *testing.T) {
	e := newEnv(t)
	cases := map[string]struct {
		// addresses are the hub's for the guest's two networks; "" for none.
		addresses [2]string
	}{
		"NoAddresses":         {addresses: [2]string{"", ""}},
		"BothAddressed":       {addresses: [2]string{"10.10.120.7/24", "10.10.121.9/24"}},
		"OnlySecondAddressed": {addresses: [2]string{"", "10.10.121.10/24"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			m := e.machine()
			m.Networks = []driver.Network{{Name: e.ns + "_net-db", CIDR: "10.10.120.0/24"}, {Name: e.ns + "_net-backend", CIDR: "10.10.121.0/24"}}
			addressed := false
			for i, a := range tc.addresses {
				if a != "" {
					m.Networks[i].Address = netip.MustParsePrefix(a)
					addressed = true
				}
			}
			o := e.ensureUntil(m, phaseIs(driver.PhaseRunning))
			spec := e.vm(m.UID).Spec.Template.Spec
			require.Len(t, o.Interfaces, 2)
			for i, iface := range o.Interfaces {
				assert.Equal(t, m.Networks[i].Name, iface.Network)
				if addressed {
					assert.Equal(t, macFor(m.UID, i), iface.MAC, "the MAC the driver asked for")
				} else {
					assert.Empty(t, spec.Domain.Devices.Interfaces[i].MacAddress, "KubeVirt picks the MAC, as before")
				}
				if a := tc.addresses[i]; a != "" {
					assert.Equal(t, []string{netip.MustParsePrefix(a).Addr().String()}, iface.IPs, "the hub's address, as the guest configured it")
				} else {
					require.Len(t, iface.IPs, 1)
					assert.Regexp(t, `^10\.200\.`, iface.IPs[0], "a lease from the site's network")
				}
				assert.Equal(t, driver.AddressSourceGuestAgent, iface.Source)
			}
			for _, v := range spec.Volumes {
				if v.CloudInitNoCloud != nil {
					assert.Equal(t, addressed, v.CloudInitNoCloud.NetworkData != "", "network data only for the hub's addresses")
				}
			}
		})
	}
}

func TestChangedAddressNeedsARestart(t *testing.T) {
	e := newEnv(t)
	m := e.machine()
	m.Networks[0].CIDR, m.Networks[0].Address = "10.10.120.0/24", netip.MustParsePrefix("10.10.120.7/24")
	o := e.ensureUntil(m, phaseIs(driver.PhaseRunning))
	require.Len(t, o.Interfaces, 1)
	assert.Equal(t, []string{"10.10.120.7"}, o.Interfaces[0].IPs)

	m.Networks[0].Address = netip.MustParsePrefix("10.10.120.8/24")
	o, err := e.d.Ensure(context.Background(), m)
	require.NoError(t, err)
	assert.Equal(t, driver.PhaseRunning, o.Phase, "the running guest is left alone")
	assert.True(t, o.RestartRequired, "its network data is part of its shape")
	require.Len(t, o.Interfaces, 1)
	assert.Equal(t, []string{"10.10.120.7"}, o.Interfaces[0].IPs, "the guest keeps its address until it restarts")

	m.RestartNonce = "apply"
	o = e.ensureUntil(m, func(o driver.Observation) bool { return o.Phase == driver.PhaseRunning && !o.RestartRequired })
	require.Len(t, o.Interfaces, 1)
	assert.Equal(t, []string{"10.10.120.8"}, o.Interfaces[0].IPs, "the restart applied the new address")
	assert.Equal(t, macFor(m.UID, 0), o.Interfaces[0].MAC, "on the same MAC")
	assert.Equal(t, int32(1), o.RestartCount)
}

func TestDeleteRemovesTheVMAndKeepsThePVC(t *testing.T) {
	e := newEnv(t)
	m := e.machine()
	e.ensureUntil(m, phaseIs(driver.PhaseRunning))

	require.Eventually(t, func() bool { return e.d.Delete(context.Background(), m.UID) == nil }, 10*time.Second, 50*time.Millisecond)
	assert.Zero(t, e.guests(m.UID), "the VM is gone")
	assert.Nil(t, e.vmi(m.UID), "and its VMI")
	assert.NoError(t, e.kube.Get(context.Background(), types.NamespacedName{Namespace: e.ns, Name: ObjectName(m.Disks[0].Name)}, &corev1.PersistentVolumeClaim{}), "the PVC stays")
	assert.NoError(t, e.d.Delete(context.Background(), m.UID), "deleting an absent guest succeeds")
	_, err := e.d.Observe(context.Background(), m.UID)
	assert.True(t, driver.IsNotFound(err))
}

func TestDeleteVolumeWaitsForItsGuest(t *testing.T) {
	e := newEnv(t)
	m := e.machine()
	e.ensureUntil(m, phaseIs(driver.PhaseRunning))
	pvc := types.NamespacedName{Namespace: e.ns, Name: ObjectName(m.Disks[0].Name)}
	ctx := context.Background()

	err := e.d.DeleteVolume(ctx, m.Disks[0])
	assert.True(t, driver.IsInUse(err), "a PVC a guest uses stays: %v", err)
	assert.NoError(t, e.kube.Get(ctx, pvc, &corev1.PersistentVolumeClaim{}))

	foreign := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: ObjectName("default_sites-own")},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
		},
	}
	require.NoError(t, e.kube.Create(ctx, foreign))
	require.NoError(t, e.d.DeleteVolume(ctx, driver.Disk{Name: "default_sites-own"}))
	assert.NoError(t, e.kube.Get(ctx, client.ObjectKeyFromObject(foreign), &corev1.PersistentVolumeClaim{}), "a PVC virtfleet did not make is the site's own")

	require.Eventually(t, func() bool { return e.d.Delete(ctx, m.UID) == nil }, 10*time.Second, 50*time.Millisecond)
	require.Eventually(t, func() bool { return e.d.DeleteVolume(ctx, m.Disks[0]) == nil }, 10*time.Second, 50*time.Millisecond)
	got := &corev1.PersistentVolumeClaim{}
	err = e.kube.Get(ctx, pvc, got)
	assert.True(t, kerrors.IsNotFound(err) || got.DeletionTimestamp != nil, "the PVC is deleted once its guest is gone")
	assert.NoError(t, e.d.DeleteVolume(ctx, m.Disks[0]), "deleting it again succeeds")
}

func TestCreateIsIdempotentAcrossDrivers(t *testing.T) {
	e := newEnv(t)
	m := e.machine()
	first, err := e.d.Ensure(context.Background(), m)
	require.NoError(t, err)
	require.NoError(t, e.d.Close())

	d2 := e.open()
	e.d = d2
	o := e.ensureUntil(m, phaseIs(driver.PhaseRunning))
	assert.Equal(t, first.ID, o.ID, "the same KubeVirt VM")
	assert.Equal(t, 1, e.guests(m.UID))
	list, err := d2.List(context.Background())
	require.NoError(t, err)
	assert.Len(t, list, 1, "a new driver lists the guest it did not create")
}

func TestNotVirtfleetsVMIsRefused(t *testing.T) {
	e := newEnv(t)
	m := e.machine()
	theirs := &kubevirtv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: VMName(m.UID)}, Spec: kubevirtv1.VirtualMachineSpec{
		RunStrategy: ptr(kubevirtv1.RunStrategyHalted), Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{},
	}}
	require.NoError(t, e.kube.Create(context.Background(), theirs))
	_, err := e.d.Ensure(context.Background(), m)
	assert.True(t, driver.IsTerminal(err), "%v", err)
	list, err := e.d.List(context.Background())
	require.NoError(t, err)
	assert.Empty(t, list, "never lists guests someone else made")
}

// TestKubeVirtFailuresAreReported forces each failure KubeVirt shows on a
// VM and checks it is reported Failed with KubeVirt's message, then that
// the guest runs once the cause is gone.
func TestKubeVirtFailuresAreReported(t *testing.T) {
	e := newEnv(t)
	cases := map[string]kubevirttest.Failure{
		"Unschedulable":    {Status: kubevirtv1.VirtualMachineStatusUnschedulable, Message: "0/4 nodes are available: 2 Insufficient memory"},
		"CrashLoopBackOff": {Status: kubevirtv1.VirtualMachineStatusCrashLoopBackOff, Message: "the guest stopped 3 times in a row"},
		"ErrImagePull":     {Status: kubevirtv1.VirtualMachineStatusErrImagePull, Message: "cannot pull quay.io/containerdisks/debian"},
		"DataVolumeError":  {Status: kubevirtv1.VirtualMachineStatusDataVolumeError, Message: "DataVolume root: import failed"},
	}
	for name, f := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			m := e.machine()
			nn := types.NamespacedName{Namespace: e.ns, Name: VMName(m.UID)}
			cluster.Controller.Fail(nn, f)
			o := e.ensureUntil(m, phaseIs(driver.PhaseFailed))
			assert.Contains(t, o.Message, string(f.Status))
			assert.Contains(t, o.Message, f.Message)

			cluster.Controller.Recover(nn)
			e.ensureUntil(m, phaseIs(driver.PhaseRunning))
		})
	}
}

func TestMissingPVCIsReported(t *testing.T) {
	e := newEnv(t)
	m := e.machine()
	m.Disks[0].SizeBytes = 0 // nothing to make it with: it must exist
	o := e.ensureUntil(m, phaseIs(driver.PhaseFailed))
	assert.Contains(t, o.Message, "ErrorPvcNotFound")
	assert.Contains(t, o.Message, ObjectName(m.Disks[0].Name))
}

func TestCapacityCountsSchedulableNodesAndOwnVMs(t *testing.T) {
	e := newEnv(t)
	c, err := e.d.Capacity(context.Background())
	require.NoError(t, err)
	assert.Equal(t, driver.Capacity{VCPU: 16, MemoryBytes: 64 << 30}, c, "two schedulable Ready nodes; cordoned and NotReady ones left out")

	a, b := e.machine(), e.machine()
	b.Running = false
	for _, m := range []driver.Machine{a, b} {
		_, err := e.d.Ensure(context.Background(), m)
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool {
		c, err = e.d.Capacity(context.Background())
		return err == nil && c.AllocatedVCPU == 4
	}, 5*time.Second, 20*time.Millisecond, "%+v", c)
	assert.Equal(t, int64(2<<30), c.AllocatedMemoryBytes, "stopped guests keep their allocation")
}

func TestEventsNameTheGuest(t *testing.T) {
	e := newEnv(t)
	m := e.machine()
	_, err := e.d.Ensure(context.Background(), m)
	require.NoError(t, err)
	started := false
	timeout := time.After(10 * time.Second)
	for !started {
		select {
		case ev := <-e.d.Events():
			started = ev.UID == m.UID && ev.Kind == driver.EventStarted
		case <-timeout:
			t.Fatal("no Started event for the guest")
		}
	}
}

// TestAPIServerGoesAwayAndComesBack runs last: it stops the shared API
// server.
func TestAPIServerGoesAwayAndComesBack(t *testing.T) {
	e := newEnv(t)
	m := e.machine()
	before := e.ensureUntil(m, phaseIs(driver.PhaseRunning))
	drain(e.d.Events())

	t0 := time.Now()
	require.NoError(t, cluster.StopAPIServer())
	t.Logf("stopped after %s", time.Since(t0))
	restarted := false
	defer func() {
		if !restarted {
			_ = cluster.StartAPIServer()
		}
	}()
	require.Eventually(t, func() bool {
		_, err := e.d.Ensure(context.Background(), m)
		return err != nil
	}, 10*time.Second, 50*time.Millisecond, "Ensure fails while the API server is down")
	for name, call := range map[string]func() error{
		"Ensure":   func() error { _, err := e.d.Ensure(context.Background(), m); return err },
		"Observe":  func() error { _, err := e.d.Observe(context.Background(), m.UID); return err },
		"List":     func() error { _, err := e.d.List(context.Background()); return err },
		"Capacity": func() error { _, err := e.d.Capacity(context.Background()); return err },
		"Delete":   func() error { return e.d.Delete(context.Background(), m.UID) },
	} {
		err := call()
		require.Error(t, err, name)
		assert.False(t, driver.IsNotFound(err) || driver.IsTerminal(err) || driver.IsFailing(err), "%s: a retryable error, got %v", name, err)
	}

	t.Logf("down seen after %s", time.Since(t0))
	require.NoError(t, cluster.StartAPIServer())
	t.Logf("started after %s", time.Since(t0))
	restarted = true
	resync := false
	timeout := time.After(30 * time.Second)
	for !resync {
		select {
		case ev := <-e.d.Events():
			resync = ev.Kind == driver.EventResync
		case <-timeout:
			t.Fatal("no EventResync after the API server came back")
		}
	}
	t.Logf("resync after %s", time.Since(t0))
	o := e.ensureUntil(m, phaseIs(driver.PhaseRunning))
	assert.Equal(t, before.ID, o.ID, "the same guest")
	assert.Equal(t, 1, e.guests(m.UID))
}

func drain(ch <-chan driver.Event) {
	for {
		select {
		case <-ch:
		default:
			return
		}
	}
}
