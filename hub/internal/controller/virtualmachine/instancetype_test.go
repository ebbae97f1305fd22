package virtualmachine

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/event"
	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/bus"
)

// itSpec is an instance type's spec of vcpu and memory.
func itSpec(vcpu int32, memory string) v1alpha1.InstancetypeSpec {
	return v1alpha1.InstancetypeSpec{CPU: v1alpha1.InstancetypeCPU{Guest: vcpu}, Memory: v1alpha1.InstancetypeMemory{Guest: resource.MustParse(memory)}}
}

// clusterType is the cluster-wide instance type name at generation.
func clusterType(name string, generation int64, spec v1alpha1.InstancetypeSpec) *v1alpha1.VirtualMachineClusterInstancetype {
	return &v1alpha1.VirtualMachineClusterInstancetype{ObjectMeta: metav1.ObjectMeta{Name: name, Generation: generation}, Spec: spec}
}

// typed makes the VM name the instance type name of kind, instead of its
// own vcpu and memory.
func typed(kind v1alpha1.InstancetypeKind, name string) func(*v1alpha1.VirtualMachine) {
	return func(v *v1alpha1.VirtualMachine) {
		v.Spec.ForProvider.Vcpu, v.Spec.ForProvider.Memory = 0, resource.Quantity{}
		v.Spec.ForProvider.Instancetype = &v1alpha1.InstancetypeRef{Kind: kind, Name: name}
	}
}

// recorded gives the VM a record of the cluster-wide type name at
// revision, answering the update request answered.
func recorded(name string, revision int64, spec v1alpha1.InstancetypeSpec, answered string) func(*v1alpha1.VirtualMachine) {
	return func(v *v1alpha1.VirtualMachine) {
		v.Status.InstancetypeRef = &v1alpha1.InstancetypeRevision{Kind: v1alpha1.VirtualMachineClusterInstancetypeKind, Name: name, Revision: revision, Spec: spec, UpdateRequestedAt: answered}
	}
}

// asking annotates the VM with an update request of value.
func asking(value string) func(*v1alpha1.VirtualMachine) {
	return func(v *v1alpha1.VirtualMachine) {
		v.SetAnnotations(map[string]string{v1alpha1.AnnotationInstancetypeUpdateRequestedAt: value})
	}
}

func TestRecordShape(t *testing.T) {
	small, edited, large := itSpec(2, "1Gi"), itSpec(4, "2Gi"), itSpec(8, "16Gi")
	uefi := v1alpha1.FirmwareUEFI
	cases := map[string]struct {
		vm      *v1alpha1.VirtualMachine
		objs    []client.Object
		changed bool
		// want is the record afterwards; nil means none.
		want *v1alpha1.InstancetypeRevision
		// vcpu and memory are VirtualMachine.Shape's afterwards; vcpu 0
		// means it has none.
		vcpu   int32
		memory string
		err    string
	}{
		"AVMOfItsOwnShapeHasNoRecord": {
			vm:   vm(),
			vcpu: 3, memory: "500Mi",
		},
		"TheFirstRecordIsTheTypeAsItIs": {
			vm:      vm(typed("", "small")),
			objs:    []client.Object{clusterType("small", 1, small)},
			changed: true,
			want:    &v1alpha1.InstancetypeRevision{Kind: v1alpha1.VirtualMachineClusterInstancetypeKind, Name: "small", Revision: 1, Spec: small},
			vcpu:    2, memory: "1Gi",
		},
		"ANamespacedTypeOfTheVMsNamespace": {
			vm:      vm(typed(v1alpha1.VirtualMachineInstancetypeKind, "mine")),
			objs:    []client.Object{&v1alpha1.VirtualMachineInstancetype{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "mine", Generation: 5}, Spec: large}},
			changed: true,
			want:    &v1alpha1.InstancetypeRevision{Kind: v1alpha1.VirtualMachineInstancetypeKind, Name: "mine", Revision: 5, Spec: large},
			vcpu:    8, memory: "16Gi",
		},
		"ANamespacedTypeOfAnotherNamespaceIsNotFound": {
			vm:   vm(typed(v1alpha1.VirtualMachineInstancetypeKind, "theirs")),
			objs: []client.Object{&v1alpha1.VirtualMachineInstancetype{ObjectMeta: metav1.ObjectMeta{Namespace: "other", Name: "theirs"}, Spec: large}},
			err:  "waiting for VirtualMachineInstancetype theirs in namespace default",
		},
		"AClusterTypeThatDoesNotExist": {
			vm:  vm(typed("", "huge")),
			err: "waiting for VirtualMachineClusterInstancetype huge: create it",
		},
		"AnEditedTypeLeavesTheRecord": {
			vm:   vm(typed("", "small"), recorded("small", 1, small, "")),
			objs: []client.Object{clusterType("small", 2, edited)},
			want: &v1alpha1.InstancetypeRevision{Kind: v1alpha1.VirtualMachineClusterInstancetypeKind, Name: "small", Revision: 1, Spec: small},
			vcpu: 2, memory: "1Gi",
		},
		"AnUpdateRequestMovesItToTheCurrentRevision": {
			vm:      vm(typed("", "small"), recorded("small", 1, small, ""), asking("t1")),
			objs:    []client.Object{clusterType("small", 2, edited)},
			changed: true,
			want:    &v1alpha1.InstancetypeRevision{Kind: v1alpha1.VirtualMachineClusterInstancetypeKind, Name: "small", Revision: 2, Spec: edited, UpdateRequestedAt: "t1"},
			vcpu:    4, memory: "2Gi",
		},
		"AnAnsweredRequestMovesNothing": {
			vm:   vm(typed("", "small"), recorded("small", 2, edited, "t1"), asking("t1")),
			objs: []client.Object{clusterType("small", 3, large)},
			want: &v1alpha1.InstancetypeRevision{Kind: v1alpha1.VirtualMachineClusterInstancetypeKind, Name: "small", Revision: 2, Spec: edited, UpdateRequestedAt: "t1"},
			vcpu: 4, memory: "2Gi",
		},
		"RemovingTheAnnotationMovesNothing": {
			vm:   vm(typed("", "small"), recorded("small", 2, edited, "t1")),
			objs: []client.Object{clusterType("small", 3, large)},
			want: &v1alpha1.InstancetypeRevision{Kind: v1alpha1.VirtualMachineClusterInstancetypeKind, Name: "small", Revision: 2, Spec: edited, UpdateRequestedAt: "t1"},
			vcpu: 4, memory: "2Gi",
		},
		"NamingAnotherTypeRecordsIt": {
			vm:      vm(typed("", "large"), recorded("small", 1, small, "")),
			objs:    []client.Object{clusterType("large", 1, large)},
			changed: true,
			want:    &v1alpha1.InstancetypeRevision{Kind: v1alpha1.VirtualMachineClusterInstancetypeKind, Name: "large", Revision: 1, Spec: large},
			vcpu:    8, memory: "16Gi",
		},
		"AnUpdateRequestForATypeGoneKeepsTheRecord": {
			vm:   vm(typed("", "small"), recorded("small", 1, small, ""), asking("t1")),
			want: &v1alpha1.InstancetypeRevision{Kind: v1alpha1.VirtualMachineClusterInstancetypeKind, Name: "small", Revision: 1, Spec: small},
			vcpu: 2, memory: "1Gi",
			err: "waiting for VirtualMachineClusterInstancetype small",
		},
		"AVMThatStopsNamingATypeDropsTheRecord": {
			vm:      vm(recorded("small", 1, small, "")),
			changed: true,
			vcpu:    3, memory: "500Mi",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			changed, err := recordShape(t.Context(), kube(t, tc.objs...), tc.vm)
			if tc.err != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.err)
				var missing *MissingTemplateError
				assert.True(t, errors.As(err, &missing), "a missing template is a MissingTemplateError")
			} else {
				require.NoError(t, err)
			}
			assert.Equal(t, tc.changed, changed)
			assert.Equal(t, tc.want, tc.vm.Status.InstancetypeRef)
			vcpu, memory, ok := tc.vm.Shape()
			assert.Equal(t, tc.vcpu != 0, ok, "the VM has a shape")
			if ok {
				assert.Equal(t, tc.vcpu, vcpu)
				assert.Equal(t, tc.memory, memory.String())
			}
		})
	}

	t.Run("APreferenceGivesTheFirmwareTheVMDoesNotSet", func(t *testing.T) {
		pref := &v1alpha1.VirtualMachineClusterPreference{ObjectMeta: metav1.ObjectMeta{Name: "efi", Generation: 1}, Spec: v1alpha1.PreferenceSpec{PreferredFirmware: &uefi}}
		v := vm(func(v *v1alpha1.VirtualMachine) { v.Spec.ForProvider.Preference = &v1alpha1.PreferenceRef{Name: "efi"} })
		changed, err := recordShape(t.Context(), kube(t, pref), v)
		require.NoError(t, err)
		assert.True(t, changed)
		require.NotNil(t, v.Status.PreferenceRef)
		assert.Equal(t, v1alpha1.VirtualMachineClusterPreferenceKind, v.Status.PreferenceRef.Kind)
		assert.Equal(t, wireFirmware(t, v), "uefi", "the intent boots the preference's firmware")

		bios := v1alpha1.FirmwareBIOS
		v.Spec.ForProvider.Firmware = &bios
		assert.Equal(t, wireFirmware(t, v), "bios", "the VM's own firmware wins")
	})
}

// wireFirmware is the firmware vm's intent asks its node for.
func wireFirmware(t *testing.T, v *v1alpha1.VirtualMachine) string {
	t.Helper()
	return string(intent(v, dependencies{}).Machine.Firmware)
}

// typedVM is a VM of namespace that boots from the Volume root and names
// the instance type name of kind.
func typedVM(namespace, name string, kind v1alpha1.InstancetypeKind, typeName string) *v1alpha1.VirtualMachine {
	return &v1alpha1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: v1alpha1.VirtualMachineSpec{ForProvider: v1alpha1.VirtualMachineParameters{
			Instancetype:    &v1alpha1.InstancetypeRef{Kind: kind, Name: typeName},
			DiskAttachments: []v1alpha1.DiskAttachment{{Name: "root"}},
		}},
	}
}

// TestInstancetypesOnARealAPIServer runs the placement loop against a real
// API server and informer cache, and the VM controller's record of a placed
// VM's shape against the same server: a VM naming an instance type is
// placed by the type's shape and records it; a namespaced type of another
// namespace cannot be named, and one made in the VM's own namespace is
// taken at once; editing the type leaves the placed VM's shape; an update
// request moves it, and its intent with it; a type gone keeps the shape.
func TestInstancetypesOnARealAPIServer(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a kube-apiserver; skipped with -short")
	}
	sl := startScheduler(t, false, nil)
	cp, ctx, b, rec := sl.cp, sl.ctx, sl.b, sl.rec
	for _, ns := range []string{"default", "tenant-b"} {
		if ns != "default" {
			require.NoError(t, cp.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}))
		}
		root := vol("root", "")
		root.Namespace, root.UID = ns, ""
		require.NoError(t, cp.Client.Create(ctx, root))
	}
	small, edited := itSpec(2, "1Gi"), itSpec(4, "2Gi")
	require.NoError(t, cp.Client.Create(ctx, clusterType("small", 0, small)))
	require.NoError(t, cp.Client.Create(ctx, clusterType("huge", 0, itSpec(8, "1Gi"))))
	require.NoError(t, cp.Client.Create(ctx, &v1alpha1.VirtualMachineInstancetype{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "mine"}, Spec: small}))

	await := func(t *testing.T, v *v1alpha1.VirtualMachine, what string, check func(*v1alpha1.VirtualMachine) bool) *v1alpha1.VirtualMachine {
		t.Helper()
		got := &v1alpha1.VirtualMachine{}
		require.Eventually(t, func() bool {
			return cp.Client.Get(ctx, client.ObjectKeyFromObject(v), got) == nil && check(got)
		}, 30*time.Second, 10*time.Millisecond, "%s: last %+v %+v events %+v", what, got.Status.Conditions, got.Status.InstancetypeRef, rec.Events())
		return got
	}
	placed := func(v *v1alpha1.VirtualMachine) bool { return v.GetAnnotations()[v1alpha1.AnnotationNode] == testNode }
	pending := func(msg string) func(*v1alpha1.VirtualMachine) bool {
		return func(v *v1alpha1.VirtualMachine) bool {
			return v.Status.AtProvider.Phase == v1alpha1.PhasePending && strings.Contains(v.GetCondition(xpv2.TypeReady).Message, msg)
		}
	}

	t.Run("PlacedByTheTypesShape", func(t *testing.T) {
		big := typedVM("default", "big", "", "huge")
		require.NoError(t, cp.Client.Create(ctx, big))
		await(t, big, "a VM waits for a node", pending("no node has sent a heartbeat"))
		b.SetNode(bus.NodeEvent{Node: testNode, Heartbeat: wire.NodeHeartbeat{
			Backend: "libvirt", Capacity: wire.Resources{VCPU: 4, MemoryBytes: 8 << 30},
		}})
		got := await(t, big, "a VM whose type no node fits is Pending", pending("4 vCPU free, 8 requested"))
		require.NotNil(t, got.Status.InstancetypeRef, "the shape is recorded before placement")
		assert.Equal(t, int32(8), got.Status.InstancetypeRef.Spec.CPU.Guest)

		web := typedVM("default", "web", "", "small")
		require.NoError(t, cp.Client.Create(ctx, web))
		got = await(t, web, "a VM whose type fits is placed", placed)
		assert.Equal(t, &v1alpha1.InstancetypeRevision{Kind: v1alpha1.VirtualMachineClusterInstancetypeKind, Name: "small", Revision: 1, Spec: small}, got.Status.InstancetypeRef)
	})

	t.Run("ANamespacedTypeOfAnotherNamespaceCannotBeNamed", func(t *testing.T) {
		sneaky := typedVM("tenant-b", "sneaky", v1alpha1.VirtualMachineInstancetypeKind, "mine")
		require.NoError(t, cp.Client.Create(ctx, sneaky))
		got := await(t, sneaky, "default's type is not tenant-b's", pending("waiting for VirtualMachineInstancetype mine in namespace tenant-b"))
		assert.Nil(t, got.Status.InstancetypeRef)
		assert.Empty(t, got.GetAnnotations()[v1alpha1.AnnotationNode])

		require.NoError(t, cp.Client.Create(ctx, &v1alpha1.VirtualMachineInstancetype{ObjectMeta: metav1.ObjectMeta{Namespace: "tenant-b", Name: "mine"}, Spec: itSpec(1, "512Mi")}))
		got = await(t, sneaky, "its own namespace's type places it at once", placed)
		require.NotNil(t, got.Status.InstancetypeRef)
		assert.Equal(t, int32(1), got.Status.InstancetypeRef.Spec.CPU.Guest)
	})

	t.Run("EditingTheTypeLeavesThePlacedVMUntilItAsks", func(t *testing.T) {
		c := &connector{kube: cp.Client, recorder: rec}
		web := await(t, typedVM("default", "web", "", "small"), "placed", placed)
		it := &v1alpha1.VirtualMachineClusterInstancetype{}
		require.NoError(t, cp.Client.Get(ctx, client.ObjectKey{Name: "small"}, it))
		it.Spec = edited
		require.NoError(t, cp.Client.Update(ctx, it))

		wrote, err := c.recordShape(ctx, web)
		require.NoError(t, err)
		assert.False(t, wrote, "an edit of the type is no reason to record anew")
		assert.Equal(t, int32(2), intent(web, dependencies{}).Machine.VCPU)
		assert.Equal(t, &wire.InstancetypeRevision{Kind: wire.ClusterInstancetypeKind, Name: "small", Revision: 1}, intent(web, dependencies{}).Machine.Instancetype,
			"the intent names the revision the shape came from")

		meta.AddAnnotations(web, map[string]string{v1alpha1.AnnotationInstancetypeUpdateRequestedAt: "t1"})
		require.NoError(t, cp.Client.Update(ctx, web))
		wrote, err = c.recordShape(ctx, web)
		require.NoError(t, err)
		assert.True(t, wrote)
		got := &v1alpha1.VirtualMachine{}
		require.NoError(t, cp.Client.Get(ctx, client.ObjectKeyFromObject(web), got))
		assert.Equal(t, &v1alpha1.InstancetypeRevision{Kind: v1alpha1.VirtualMachineClusterInstancetypeKind, Name: "small", Revision: 2, Spec: edited, UpdateRequestedAt: "t1"}, got.Status.InstancetypeRef)
		m := intent(got, dependencies{}).Machine
		assert.Equal(t, int32(4), m.VCPU, "the intent carries the new revision")
		assert.Equal(t, int64(2<<30), m.MemoryBytes)
		assert.Equal(t, &wire.InstancetypeRevision{Kind: wire.ClusterInstancetypeKind, Name: "small", Revision: 2}, m.Instancetype)

		require.NoError(t, cp.Client.Delete(ctx, it))
		meta.AddAnnotations(got, map[string]string{v1alpha1.AnnotationInstancetypeUpdateRequestedAt: "t2"})
		require.NoError(t, cp.Client.Update(ctx, got))
		wrote, err = c.recordShape(ctx, got)
		require.NoError(t, err, "a placed VM keeps its shape")
		assert.False(t, wrote)
		assert.Equal(t, int64(2), got.Status.InstancetypeRef.Revision)
		kept := false
		for _, ev := range rec.Events() {
			kept = kept || (ev.Type == event.TypeWarning && ev.Reason == ReasonShapeKept)
		}
		assert.True(t, kept, "a Warning event says the VM keeps its shape")
	})
}
