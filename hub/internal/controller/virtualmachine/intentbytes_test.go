package virtualmachine

import (
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/crossplane/crossplane-runtime/v2/pkg/controller"
	"github.com/crossplane/crossplane-runtime/v2/pkg/event"
	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/controller/controllertest"
	"github.com/virtfleet/virtfleet/hub/internal/controller/providerconfig"
	"github.com/virtfleet/virtfleet/hub/internal/ipam"
	"github.com/virtfleet/virtfleet/hub/internal/perobject"
	"github.com/virtfleet/virtfleet/hub/internal/placement"
)

// TestOneNamespaceCannotFillTheIntentsBucket pins that the intents of one
// namespace's VMs take at most its share of the intents bucket
// (Options.IntentBytesPerNamespace), so that another namespace's VMs are
// still published when it is full.
//
// The attack, by a tenant with edit rights in namespace a and nothing
// more: it creates VM after VM, each with the longest cloud-init user data
// the API takes (kubectl apply -f vm-N.yaml, spec.forProvider.userData of
// 64 KiB), until the intents bucket is full; from then on every other
// namespace's publishes fail, and their VMs never start. Before shares,
// only the bucket's own max bytes bounded it.
func TestOneNamespaceCannotFillTheIntentsBucket(t *testing.T) {
	if testing.Short() {
		t.Skip("needs a kube-apiserver and a nats-server; skipped with -short")
	}
	env := controllertest.Start(t, []string{"node1"}, func(ctrl.Manager, controller.Options, *controllertest.Env) error { return nil })
	for _, ns := range []string{"intent-bytes-a", "intent-bytes-b"} {
		require.NoError(t, env.Kube.Create(env.Ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}))
	}
	attacker := func(name string) *v1alpha1.VirtualMachine {
		t.Helper()
		vm := env.VM(t, "intent-bytes-a", name, "node1", true, v1alpha1.PhaseScheduled)
		vm.Spec.ForProvider.UserData = strings.Repeat("#", 64<<10)
		require.NoError(t, env.Kube.Update(env.Ctx, vm))
		return vm
	}
	a1, a2, a3 := attacker("a1"), attacker("a2"), attacker("a3")
	b1 := env.VM(t, "intent-bytes-b", "b1", "node1", true, v1alpha1.PhaseScheduled)

	g, err := providerconfig.GrantOf(env.Ctx, env.Kube, "intent-bytes-a")
	require.NoError(t, err)
	e := &external{connector: &connector{log: logging.NewNopLogger(), kube: env.Kube, reader: env.Kube, recorder: event.NewNopRecorder(),
		opts:  Options{Placer: placement.New(), Addresses: ipam.New(env.Kube, env.Kube)},
		state: newState(perobject.NewOwner(nil))}, fleet: env.Fleet.Fleet, grant: g}
	// Room for two of the attacker's VMs and a small one, not for three.
	one, err := wire.GuestIntents.Encode(intent(a1, dependencies{}))
	require.NoError(t, err)
	e.opts.IntentBytesPerNamespace = int64(len(one))*2 + int64(len(one))/2

	published := func(vm *v1alpha1.VirtualMachine) bool {
		_, ok := controllertest.Stored(t, env.Fleet, wire.GuestIntents, "node1", string(vm.UID))
		return ok
	}
	require.NoError(t, e.publish(env.Ctx, a1, dependencies{}, "node1"))
	require.NoError(t, e.publish(env.Ctx, a2, dependencies{}, "node1"))
	// Publishing a VM's intent again takes nothing more.
	require.NoError(t, e.publish(env.Ctx, a2, dependencies{}, "node1"))

	err = e.publish(env.Ctx, a3, dependencies{}, "node1")
	require.Error(t, err, "the third VM would take namespace a past its share")
	for _, want := range []string{"namespace intent-bytes-a", "--intent-bytes-per-namespace", "bytes"} {
		assert.Contains(t, err.Error(), want)
	}
	assert.Contains(t, err.Error(), strconv.FormatInt(e.opts.IntentBytesPerNamespace, 10), "the error names the limit")
	assert.False(t, published(a3), "nothing of the refused VM reaches the bucket")

	require.NoError(t, e.publish(env.Ctx, b1, dependencies{}, "node1"), "another namespace's share is its own")
	assert.True(t, published(b1))

	// One of the attacker's VMs goes: its intent is deleted, and its bytes
	// are the refused VM's.
	_, err = e.Delete(env.Ctx, a1)
	require.NoError(t, err)
	assert.False(t, published(a1))
	require.NoError(t, e.publish(env.Ctx, a3, dependencies{}, "node1"))
	assert.True(t, published(a3))
}

// TestIntentBytesKeepEachNamespacesTotal follows the counter through what
// a VM's intents go through: reserved, published (settled), grown,
// refused, deleted (freed) and forgotten with the VM. Each namespace's
// total is kept as they change, never summed over the VMs.
func TestIntentBytesKeepEachNamespacesTotal(t *testing.T) {
	owner := perobject.NewOwner(nil)
	b := newIntentBytes(owner)
	intent := func(userData int) map[string]wire.Intent {
		in := wire.Intent{UID: "u", Name: "vm", Namespace: "a"}
		in.Machine.UserData = strings.Repeat("x", userData)
		return map[string]wire.Intent{"node1": in}
	}
	size := func(userData int) int64 {
		v, err := wire.GuestIntents.Encode(intent(userData)["node1"])
		require.NoError(t, err)
		return int64(len(v))
	}
	small, big := size(100), size(1000)
	limit := big + small/2

	steps := []struct {
		name string
		do   func() error
		// wantErr is set for a reserve the share refuses.
		wantErr bool
		a, b    int64
	}{
		{name: "AFirstVMIsReserved", do: func() error { _, err := b.reserve("vm1", "a", intent(100), limit); return err }, a: small},
		{name: "AndSettled", do: func() error { b.settle("vm1", "a", small); return nil }, a: small},
		{name: "ASecondFits", do: func() error { _, err := b.reserve("vm2", "a", intent(100), limit); return err }, a: 2 * small},
		{name: "TheSameIntentAgainCountsNothingMore", do: func() error { _, err := b.reserve("vm2", "a", intent(100), limit); return err }, a: 2 * small},
		{name: "AGrowthPastTheShareIsRefusedAndCountsNothing", do: func() error { _, err := b.reserve("vm2", "a", intent(1000), limit); return err }, wantErr: true, a: 2 * small},
		{name: "AnotherNamespaceIsNotHeldBack", do: func() error { _, err := b.reserve("vm3", "b", intent(1000), limit); return err }, a: 2 * small, b: big},
		{name: "AFreedVMLeavesRoom", do: func() error { b.free("vm1"); return nil }, a: small, b: big},
		{name: "SoTheGrowthFitsNow", do: func() error { _, err := b.reserve("vm2", "a", intent(1000), limit); return err }, a: big, b: big},
		{name: "AShrinkCountsTheLargerUntilSettled", do: func() error { _, err := b.reserve("vm2", "a", intent(100), limit); return err }, a: big, b: big},
		{name: "ThenTheSmaller", do: func() error { b.settle("vm2", "a", small); return nil }, a: small, b: big},
		{name: "AVMForgottenWithItsObjectIsFreed", do: func() error { owner.Forget("vm3"); return nil }, a: small},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			err := s.do()
			if s.wantErr {
				require.Error(t, err)
				assert.Contains(t, err.Error(), "namespace a holds")
			} else {
				require.NoError(t, err)
			}
			assert.Equal(t, s.a, b.held("a"), "namespace a")
			assert.Equal(t, s.b, b.held("b"), "namespace b")
		})
	}
}

// BenchmarkIntentBytesReserve is a publish's check against its namespace's
// share with 100,000 VMs counted: it costs the same as with one.
func BenchmarkIntentBytesReserve(b *testing.B) {
	bytes := newIntentBytes(perobject.NewOwner(nil))
	for i := range 100_000 {
		bytes.settle(types.UID("vm-"+strconv.Itoa(i)), "ns-"+strconv.Itoa(i%100), 2048)
	}
	intents := map[string]wire.Intent{"node1": {UID: "vm-0", Name: "vm-0", Namespace: "ns-0"}}
	for b.Loop() {
		if _, err := bytes.reserve("vm-0", "ns-0", intents, 1<<30); err != nil {
			b.Fatal(err)
		}
	}
}
