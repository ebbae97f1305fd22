package volume

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/crossplane/crossplane-runtime/v2/pkg/controller"
	"github.com/crossplane/crossplane-runtime/v2/pkg/event"

	"github.com/virtfleet/virtfleet/hub/internal/controller/controllertest"
	"github.com/virtfleet/virtfleet/hub/internal/controller/inuse"
	"github.com/virtfleet/virtfleet/hub/internal/fleet"
	"github.com/virtfleet/virtfleet/hub/internal/perobject"
	"github.com/virtfleet/virtfleet/hub/internal/quota"
	"github.com/virtfleet/virtfleet/hub/internal/wake"
)

// TestAVolumeWhoseGrowthIsHeldSaysSo pins that a Volume whose growth its
// namespace's quota holds says so itself, naming the limit: the tenant
// edited the Volume, and its VM's Ready message is not where it looks.
//
// Attacker's steps (or a user's mistake), a tenant whose namespace has a
// TenantQuota of 10Gi of storage and an 8Gi Volume on node1: `kubectl -n
// team patch volume root --type merge -p
// '{"spec":{"forProvider":{"size":"100Gi"}}}'`, then `kubectl -n team
// describe volume root`. Before, the Volume showed Ready and nothing
// else, while the hub kept it at 8Gi.
func TestAVolumeWhoseGrowthIsHeldSaysSo(t *testing.T) {
	if testing.Short() {
		t.Skip("needs a kube-apiserver and a nats-server; skipped with -short")
	}
	env := controllertest.Start(t, []string{"node1"}, func(ctrl.Manager, controller.Options, *controllertest.Env) error { return nil })
	f := env.Fleet

	cases := map[string]struct {
		grow string
		// held is the Volume's Ready message, "" when it says nothing.
		held string
	}{
		"NoGrowth":       {grow: "8Gi"},
		"WithinTheQuota": {grow: "10Gi"},
		"PastTheQuota": {grow: "100Gi",
			held: "keeps its size of 8Gi: quota of namespace %s exceeded: storage would be 100Gi of 10Gi (TenantQuota %s; 8Gi in use, this Volume's growth 92Gi)"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			ns := env.Namespace(t)
			env.StorageQuota(t, ns, "10Gi")
			root := env.Volume(t, ns, "root", "8Gi")
			env.Bind(t, root, "node1")
			// The hub made it at 8Gi.
			require.NoError(t, f.RecordSize(env.Ctx, string(root.UID), 8<<30))

			// The tenant's step.
			root.Spec.ForProvider.Size = resource.MustParse(tc.grow)
			require.NoError(t, env.Kube.Update(env.Ctx, root))

			r := NewReleaser(env.Kube, env.Pool, time.Minute, wake.NewNotifier(perobject.NewOwner(nil)), event.NewNopRecorder(), perobject.NewOwner(nil))
			r.quotas = quota.NewCounter(env.Kube, func() []*fleet.Fleet { return []*fleet.Fleet{f.Fleet} })
			got, err := r.Observe(env.Ctx, env.Kube, root, inuse.Users{})
			require.NoError(t, err)
			assert.Equal(t, corev1.ConditionTrue, got.Status, "the Volume is there, at the size it has")
			want := ""
			if tc.held != "" {
				want = fmt.Sprintf(tc.held, ns, ns)
			}
			assert.Equal(t, want, got.Message)
		})
	}
}

// TestAVolumeDeletedOnNoNodeLeavesNoSizeRecord pins that the size a VM's
// placement recorded for a Volume goes with the Volume when the VM went
// before it bound the Volume: nothing else would remove it from the
// intents bucket.
func TestAVolumeDeletedOnNoNodeLeavesNoSizeRecord(t *testing.T) {
	if testing.Short() {
		t.Skip("needs a kube-apiserver and a nats-server; skipped with -short")
	}
	env := controllertest.Start(t, []string{"node1"}, func(ctrl.Manager, controller.Options, *controllertest.Env) error { return nil })
	f := env.Fleet

	for name, placed := range map[string]bool{"RecordedByAPlacement": true, "NeverPlaced": false} {
		t.Run(name, func(t *testing.T) {
			root := env.Volume(t, env.Namespace(t), "root", "8Gi")
			if placed {
				require.NoError(t, f.RecordSize(env.Ctx, string(root.UID), 8<<30))
			}

			r := NewReleaser(env.Kube, env.Pool, time.Minute, wake.NewNotifier(perobject.NewOwner(nil)), event.NewNopRecorder(), perobject.NewOwner(nil))
			released, err := r.Release(env.Ctx, root)
			require.NoError(t, err)
			assert.True(t, released, "a Volume on no node goes at once")
			_, ok, err := f.Restarted(t).SizeInEffect(string(root.UID))
			require.NoError(t, err)
			assert.False(t, ok, "the intents bucket holds no size of the Volume")
		})
	}
}
