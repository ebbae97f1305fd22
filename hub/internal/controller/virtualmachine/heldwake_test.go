package virtualmachine

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlevent "sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	apisv1alpha1 "github.com/virtfleet/virtfleet/apis/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/controller/controllertest"
	"github.com/virtfleet/virtfleet/hub/internal/perobject"
)

// TestANamespaceWithRoomAgainWakesTheVMWhoseGrowthItHeld pins that a VM
// whose Volume's growth a TenantQuota held is reconciled the moment the
// quota makes room, and its Volume then grows.
//
// Attacker's steps, a tenant whose namespace has a TenantQuota of 10Gi of
// storage and an 8Gi Volume root attached to its running VM web: `kubectl
// -n team patch volume root --type merge -p
// '{"spec":{"forProvider":{"size":"9Gi"}}}'` while its 2Gi Volume spare
// holds the rest; the VM's Ready message says root keeps 8Gi. The cluster
// admin then raises the quota to 200Gi or deletes it, or the tenant
// deletes spare. Before, nothing woke web: root stayed at 8Gi until the
// VM's next poll.
func TestANamespaceWithRoomAgainWakesTheVMWhoseGrowthItHeld(t *testing.T) {
	if testing.Short() {
		t.Skip("needs a kube-apiserver and a nats-server; skipped with -short")
	}
	env, counter := placementEnv(t)

	// wake hands the change that made room to the VM controller's handler.
	type wake func(h heldGrowths, queue workqueue.TypedRateLimitingInterface[reconcile.Request])
	// Each case makes room in the namespace of q, where Volume spare is
	// on node1, and returns its wake.
	cases := map[string]func(t *testing.T, env *controllertest.Env, q *apisv1alpha1.TenantQuota, spare *v1alpha1.Volume) wake{
		"QuotaRaised": func(t *testing.T, env *controllertest.Env, q *apisv1alpha1.TenantQuota, _ *v1alpha1.Volume) wake {
			old := q.DeepCopy()
			q.Spec.Hard.Storage = ptr.To(resource.MustParse("200Gi"))
			require.NoError(t, env.Kube.Update(env.Ctx, q))
			return func(h heldGrowths, queue workqueue.TypedRateLimitingInterface[reconcile.Request]) {
				h.onQuota().Update(env.Ctx, ctrlevent.UpdateEvent{ObjectOld: old, ObjectNew: q}, queue)
			}
		},
		"QuotaDeleted": func(t *testing.T, env *controllertest.Env, q *apisv1alpha1.TenantQuota, _ *v1alpha1.Volume) wake {
			require.NoError(t, env.Kube.Delete(env.Ctx, q))
			return func(h heldGrowths, queue workqueue.TypedRateLimitingInterface[reconcile.Request]) {
				h.onQuota().Delete(env.Ctx, ctrlevent.DeleteEvent{Object: q}, queue)
			}
		},
		"AnotherVolumeDeleted": func(t *testing.T, env *controllertest.Env, _ *apisv1alpha1.TenantQuota, spare *v1alpha1.Volume) wake {
			require.NoError(t, env.Kube.Delete(env.Ctx, spare))
			return func(h heldGrowths, queue workqueue.TypedRateLimitingInterface[reconcile.Request]) {
				h.onVolumeGone().Delete(env.Ctx, ctrlevent.DeleteEvent{Object: spare}, queue)
			}
		},
	}
	for name, makeRoom := range cases {
		t.Run(name, func(t *testing.T) {
			ns := env.Namespace(t)
			vm, root, e := placedWeb(t, env, counter, ns)
			e.state = newState(perobject.NewOwner(nil))
			_, err := publishSteps(env, e, vm)
			require.NoError(t, err)

			spare := &v1alpha1.Volume{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "spare", Annotations: map[string]string{v1alpha1.AnnotationNode: "node1"}}}
			spare.Spec.ForProvider.Size = resource.MustParse("2Gi")
			require.NoError(t, env.Kube.Create(env.Ctx, spare))

			// The tenant's step: a growth past the quota (8Gi, and 2Gi
			// of spare, of 10Gi), held.
			env.Get(t, root)
			root.Spec.ForProvider.Size = resource.MustParse("9Gi")
			require.NoError(t, env.Kube.Update(env.Ctx, root))
			d, err := publishSteps(env, e, vm)
			require.NoError(t, err)
			require.NotEmpty(t, d.heldGrowth, "the quota holds the growth")
			e.state.held.note(vm, len(d.heldGrowth) > 0) // as Observe notes it

			// A held VM of another namespace, which the room made here
			// must not wake.
			other := vm.DeepCopy()
			other.Namespace, other.UID = ns+"-other", vm.UID+"-other"
			e.state.held.note(other, true)

			q := &apisv1alpha1.TenantQuota{}
			require.NoError(t, env.Kube.Get(env.Ctx, client.ObjectKey{Name: ns}, q))
			woken := makeRoom(t, env, q, spare)
			queue := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[reconcile.Request]())
			t.Cleanup(queue.ShutDown)
			woken(e.state.held, queue)
			require.Equal(t, 1, queue.Len(), "only the VM whose growth the quota held is woken")
			got, _ := queue.Get()
			assert.Equal(t, client.ObjectKeyFromObject(vm), got.NamespacedName)

			// The reconcile it wakes grows root.
			d, err = publishSteps(env, e, vm)
			require.NoError(t, err)
			assert.Empty(t, d.heldGrowth)
			size, ok, err := e.fleet.SizeInEffect(string(root.UID))
			require.NoError(t, err)
			require.True(t, ok)
			assert.Equal(t, int64(9<<30), size, "root's size record carries its growth")
		})
	}
}
