package virtualmachine

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/crossplane/crossplane-runtime/v2/pkg/controller"
	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/controller/controllertest"
	"github.com/virtfleet/virtfleet/hub/internal/controller/providerconfig"
	"github.com/virtfleet/virtfleet/hub/internal/fleet"
	"github.com/virtfleet/virtfleet/hub/internal/fleet/fleettest"
	"github.com/virtfleet/virtfleet/hub/internal/placement"
	"github.com/virtfleet/virtfleet/hub/internal/quota"
)

// fromImage is an unbound Volume made from the DiskImage image.
func fromImage(name, image string) *v1alpha1.Volume {
	v := vol(name, "")
	v.Spec.ForProvider.Source = &v1alpha1.VolumeSource{DiskImageRef: &v1alpha1.LocalReference{Name: v1alpha1.LocalName(image)}}
	return v
}

// goldenCloneOfAGoneVolume makes DiskImage golden in namespace ns, a clone
// of Volume base (which does not exist), its status Ready and made on
// node1.
func goldenCloneOfAGoneVolume(t *testing.T, env *controllertest.Env, ns string) *v1alpha1.DiskImage {
	t.Helper()
	golden := &v1alpha1.DiskImage{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "golden"}}
	golden.Spec.ForProvider.Source.VolumeRef = &v1alpha1.LocalReference{Name: "base"}
	require.NoError(t, env.Kube.Create(env.Ctx, golden))
	golden.Status.AtProvider.Phase, golden.Status.AtProvider.Nodes = v1alpha1.ImagePhaseReady, []string{"node1"}
	require.NoError(t, env.Kube.Status().Update(env.Ctx, golden))
	return golden
}

func TestResolveImages(t *testing.T) {
	raw := v1alpha1.DiskFormatRaw
	img := &v1alpha1.DiskImage{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "ubuntu", UID: "img-1"},
		Spec: v1alpha1.DiskImageSpec{ForProvider: v1alpha1.DiskImageParameters{
			Source:     v1alpha1.DiskImageSource{URL: "http://127.0.0.1/u.img", SHA256: "ab"},
			Format:     &raw,
			PruneAfter: &metav1.Duration{Duration: 30 * time.Minute},
		}},
	}
	machine := vm(func(m *v1alpha1.VirtualMachine) { m.Spec.ForProvider.VirtualNetworks = nil })

	t.Run("AMissingImageKeepsTheVMWaitingAndSaysForWhat", func(t *testing.T) {
		_, err := resolve(context.Background(), kube(t, fromImage("root", "ubuntu"), fromImage("data", "ubuntu")), machine, nil)
		var missing *MissingError
		require.True(t, errors.As(err, &missing), "%v", err)
		assert.Equal(t, []string{"ubuntu"}, missing.Images, "named once however many volumes use it")
		assert.EqualError(t, err, "waiting for DiskImage ubuntu in namespace default: create them and the VM goes on by itself")
	})
	t.Run("TheIntentCarriesTheResolvedImageOnItsVolumeOnly", func(t *testing.T) {
		d, err := resolve(context.Background(), kube(t, fromImage("root", "ubuntu"), vol("data", ""), img), machine, nil)
		require.NoError(t, err)
		in := intent(machine, d)
		require.Len(t, in.Machine.Disks, 2)
		assert.Equal(t, &wire.ImageRef{Name: "ubuntu", UID: "img-1", URL: "http://127.0.0.1/u.img", Checksum: "ab", Format: "raw", PruneAfterSeconds: 1800}, in.Machine.Disks[0].Image)
		assert.Nil(t, in.Machine.Disks[1].Image)
	})
}

// TestANewDiskOfAClonedImageIsNeverMadeEmpty pins that a VM's new disk of
// a cloned DiskImage whose source is gone is sent the image to make it of,
// never no image at all: once the node holds the image (its own report),
// the disk is made of that copy; until then the VM waits, naming the image
// and its missing source. The first clone, whose disk its node made, goes
// on without the source.
//
// Before, the hub let the source go once the DiskImage's status said Ready
// on the node, and a second VM's new Volume of the image, on that same
// node, was sent without an image: the node made it an empty disk.
func TestANewDiskOfAClonedImageIsNeverMadeEmpty(t *testing.T) {
	if testing.Short() {
		t.Skip("needs a kube-apiserver and a nats-server; skipped with -short")
	}
	env := controllertest.Start(t, []string{"node1", "node2"}, func(ctrl.Manager, controller.Options, *controllertest.Env) error { return nil })
	f := env.Fleet
	ns := env.Namespace(t)

	// DiskImage golden cloned Volume base, which is gone now; its status
	// says Ready on node1, where the first clone's disk was made of it.
	golden := goldenCloneOfAGoneVolume(t, env, ns)
	onNode1 := func(name string) {
		v := &v1alpha1.Volume{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
		v.Spec.ForProvider.Size = resource.MustParse("1Gi")
		v.Spec.ForProvider.Source = &v1alpha1.VolumeSource{DiskImageRef: &v1alpha1.LocalReference{Name: "golden"}}
		require.NoError(t, env.Kube.Create(env.Ctx, v))
		env.Bind(t, v, "node1")
	}
	onNode1("root")
	onNode1("root2")
	// The first clone runs on node1, which reports its disk.
	first := env.VM(t, ns, "first", "node1", true, v1alpha1.PhaseRunning)
	first.Status.AtProvider.Disks = []string{"root"}
	require.NoError(t, env.Kube.Status().Update(env.Ctx, first))
	// The second, placed on node1 too, has its disk made next.
	second := env.VM(t, ns, "second", "node1", true, v1alpha1.PhaseProvisioning)
	second.Spec.ForProvider.DiskAttachments = []v1alpha1.DiskAttachment{{Name: "root2"}}
	require.NoError(t, env.Kube.Update(env.Ctx, second))

	g, err := providerconfig.GrantOf(env.Ctx, env.Kube, ns)
	require.NoError(t, err)
	e := &external{connector: &connector{log: logging.NewNopLogger(), kube: env.Kube, opts: Options{Quotas: quota.NewCounter(env.Kube, func() []*fleet.Fleet { return []*fleet.Fleet{f.Fleet} })}}, fleet: f.Fleet, grant: g}
	// The API server defaulted its pruneAfter.
	held := &wire.ImageRef{Name: "golden", UID: string(golden.UID), Format: "qcow2", Held: true, PruneAfterSeconds: int64(golden.Spec.ForProvider.PruneAfter.Seconds())}
	const waits = "DiskImage golden clones Volume base, which does not exist; Volume root2 is not made yet and its node node1 does not hold DiskImage golden to make it of"

	steps := []struct {
		name string
		// readyOn is the node that reports golden Ready before the step.
		readyOn   string
		vm        *v1alpha1.VirtualMachine
		wantErr   string
		wantImage *wire.ImageRef
	}{
		{name: "TheFirstCloneGoesOnWithoutItsSource", vm: first, wantImage: held},
		{name: "ASecondDiskWaitsWhileItsNodeHoldsNoCopy", vm: second, wantErr: waits},
		{name: "AnotherNodesCopyMakesNoDiskOnThisOne", readyOn: "node2", vm: second, wantErr: waits},
		{name: "ASecondDiskIsMadeOfItsNodesCopy", readyOn: "node1", vm: second, wantImage: held},
	}
	for _, step := range steps {
		t.Run(step.name, func(t *testing.T) {
			if step.readyOn != "" {
				controllertest.Report(t, f.Agent(step.readyOn), wire.ImageReports, string(golden.UID), wire.ImageReport{
					UID: string(golden.UID), Name: "golden", Node: step.readyOn, Phase: wire.ImagePhaseReady, SizeBytes: 1 << 30, ObservedAt: time.Now(),
				})
				require.Eventually(t, func() bool {
					_, ok := f.Images.Report(step.readyOn, string(golden.UID))
					return ok
				}, 10*time.Second, 5*time.Millisecond, "the fleet reads node %s's report", step.readyOn)
			}
			vm := step.vm.DeepCopy()
			env.Get(t, vm)
			d, err := e.resolve(env.Ctx, vm)
			if step.wantErr != "" {
				assert.EqualError(t, err, step.wantErr)
				return
			}
			require.NoError(t, err)
			sent := e.plan(vm, d, "node1")["node1"].Machine.Disks
			require.Len(t, sent, 1)
			assert.Equal(t, step.wantImage, sent[0].Image, "what node1 makes the disk of")
		})
	}
}

// TestAVMWaitingForAHolderIsPlacedWhenOneReports pins that a VM on no node
// whose new disk is of a cloned DiskImage whose source is gone, and that
// no node holds, waits, counted as waiting, and is placed on the first
// node to report the image Ready the moment it does: the placement loop's
// backoff here is an hour, and no DiskImage controller runs, so nothing
// but the report wakes it. In the hub the image's status need not change
// either: a node that made the image and reports it again is listed there
// already.
func TestAVMWaitingForAHolderIsPlacedWhenOneReports(t *testing.T) {
	if testing.Short() {
		t.Skip("needs a kube-apiserver and a nats-server; skipped with -short")
	}
	env := controllertest.Start(t, []string{"node1", "node2"}, func(mgr ctrl.Manager, _ controller.Options, e *controllertest.Env) error {
		s := NewScheduler(mgr.GetClient(), mgr.GetCache(), e.Pool, placement.New(), quota.NewCounter(e.Kube, e.Pool.Fleets), &fleettest.Recorder{}, logging.NewNopLogger(), false).
			withBackoff(workqueue.NewTypedItemExponentialFailureRateLimiter[types.NamespacedName](time.Hour, time.Hour))
		// As the hub wires each fleet to its placement loop.
		e.Fleet.SubscribeNodes(s.RetryUnplaced)
		e.Fleet.Images.Subscribe(s.RetryImage)
		return mgr.Add(s)
	})
	for _, n := range []string{"node1", "node2"} {
		env.Fleet.Agent(n).Heartbeat(wire.NodeHeartbeat{Backend: "libvirt", Capacity: wire.Resources{VCPU: 8, MemoryBytes: 16 << 30}})
	}
	ns := env.Namespace(t)

	// DiskImage golden cloned Volume base, which is gone; node1 made it,
	// and no node reports holding it now.
	golden := goldenCloneOfAGoneVolume(t, env, ns)
	root := fromImage("root", "golden")
	root.Namespace = ns
	require.NoError(t, env.Kube.Create(env.Ctx, root))
	vm := env.VM(t, ns, "web", "", false, "")

	controllertest.Await(t, env, vm, 30*time.Second, func(c *assert.CollectT, got *v1alpha1.VirtualMachine) {
		assert.Equal(c, v1alpha1.PhasePending, got.Status.AtProvider.Phase)
		assert.Contains(c, got.GetCondition(xpv2.TypeReady).Message, "no node holds DiskImage golden to make it of: the VM waits for node1, where it was made, to report it")
	})
	_, err := resolve(env.Ctx, env.Kube, vm, heldIn(env.Fleet.Images))
	assert.Equal(t, []string{refusalWaiting}, refusalReasons(err), "counted as waiting")

	controllertest.Report(t, env.Fleet.Agent("node2"), wire.ImageReports, string(golden.UID), wire.ImageReport{
		UID: string(golden.UID), Name: "golden", Node: "node2", Phase: wire.ImagePhaseReady, SizeBytes: 1 << 30, ObservedAt: time.Now(),
	})
	controllertest.Await(t, env, vm, 10*time.Second, func(c *assert.CollectT, got *v1alpha1.VirtualMachine) {
		assert.Equal(c, "node2", got.GetAnnotations()[v1alpha1.AnnotationNode], "placed on the holder when it reports, not after the hour's backoff")
	})
}
