package virtualmachine

import (
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
