package virtualmachine

import (
	"context"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	apisv1alpha1 "github.com/virtfleet/virtfleet/apis/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/controller/index"
	"github.com/virtfleet/virtfleet/hub/internal/placement"
)

func vm(mods ...func(*v1alpha1.VirtualMachine)) *v1alpha1.VirtualMachine {
	swap := resource.MustParse("1Gi")
	v := &v1alpha1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "sample-vm", UID: types.UID("0b5e3f1a-7c2d-4e8f-9a1b-000000000001"), Generation: 3},
		Spec: v1alpha1.VirtualMachineSpec{ForProvider: v1alpha1.VirtualMachineParameters{
			Vcpu: 3, Memory: resource.MustParse("500Mi"), Swap: &swap,
			PublicKey:       "ssh-ed25519 AAAA user@host",
			VirtualNetworks: []v1alpha1.LocalName{"net-db"},
			DiskAttachments: []v1alpha1.DiskAttachment{{Name: "root"}, {Name: "data"}},
		}},
	}
	for _, m := range mods {
		m(v)
	}
	return v
}

func vol(name, node string) *v1alpha1.Volume {
	v := &v1alpha1.Volume{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID("uid-" + name)},
		Spec:       v1alpha1.VolumeSpec{ForProvider: v1alpha1.VolumeParameters{Size: resource.MustParse("10Gi")}},
	}
	if node != "" {
		v.Annotations = map[string]string{v1alpha1.AnnotationNode: node}
	}
	return v
}

func imported(v *v1alpha1.Volume, external string) *v1alpha1.Volume {
	meta.SetExternalName(v, external)
	return v
}

// importedBy is an import the node reported: Running at the volume's real
// size.
func importedBy(v *v1alpha1.Volume, external string) *v1alpha1.Volume {
	imported(v, external)
	capacity := resource.MustParse("3Gi")
	v.Status.AtProvider.Phase, v.Status.AtProvider.Capacity = v1alpha1.PhaseRunning, &capacity
	return v
}

func observed(v *v1alpha1.Volume) *v1alpha1.Volume {
	v.SetManagementPolicies(xpv2.ManagementPolicies{xpv2.ManagementActionObserve})
	return v
}

func vnet(name string) *v1alpha1.VirtualNetwork {
	return &v1alpha1.VirtualNetwork{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID("uid-" + name)},
		Spec:       v1alpha1.VirtualNetworkSpec{ForProvider: v1alpha1.VirtualNetworkParameters{Mode: v1alpha1.NetworkModeNAT, CIDR: "10.10.120.0/24"}},
	}
}

func kube(t *testing.T, objs ...client.Object) client.Client {
	t.Helper()
	s := runtime.NewScheme()
	require.NoError(t, v1alpha1.AddToScheme(s))
	require.NoError(t, corev1.AddToScheme(s))
	require.NoError(t, apisv1alpha1.AddToScheme(s))
	return fake.NewClientBuilder().WithScheme(s).WithObjects(objs...).Build()
}

// createdIn is n in namespace, created ago.
func createdIn(n *v1alpha1.VirtualNetwork, namespace string, ago time.Duration) *v1alpha1.VirtualNetwork {
	n.Namespace, n.UID = namespace, types.UID(namespace+"-"+string(n.UID))
	n.CreationTimestamp = metav1.NewTime(time.Now().Add(-ago))
	return n
}

func TestResolve(t *testing.T) {
	cases := []struct {
		name        string
		objs        []client.Object
		wantMissing *MissingError
		wantNode    string
		wantNodeErr string
		wantErr     string
	}{
		{
			name: "everything present resolves in spec order",
			objs: []client.Object{vol("root", ""), vol("data", ""), vnet("net-db")},
		},
		{
			name:        "missing volumes and networks are all named",
			objs:        []client.Object{vol("data", "")},
			wantMissing: &MissingError{Namespace: "default", Volumes: []string{"root"}, Networks: []string{"net-db"}},
		},
		{
			name:     "a bound volume pins the node",
			objs:     []client.Object{vol("root", ""), vol("data", "node2"), vnet("net-db")},
			wantNode: "node2",
		},
		{
			name:        "volumes bound to different nodes cannot be used together",
			objs:        []client.Object{vol("root", "node1"), vol("data", "node2"), vnet("net-db")},
			wantNodeErr: "live on different nodes",
		},
		{
			name:     "an imported volume the node reported is attached, and pins its node",
			objs:     []client.Object{vol("root", ""), importedBy(vol("data", "node2"), "legacy.qcow2"), vnet("net-db")},
			wantNode: "node2",
		},
		{
			name:    "a network whose cidr another namespace's network had first is refused, so no node makes it",
			objs:    []client.Object{vol("root", ""), vol("data", ""), createdIn(vnet("net-db"), "default", time.Minute), createdIn(vnet("other"), "team-b", time.Hour)},
			wantErr: "refused: VirtualNetwork net-db's spec.forProvider.cidr 10.10.120.0/24 overlaps 10.10.120.0/24 of a VirtualNetwork of another namespace, which came first; no two networks the fleet makes may overlap, since a node may host VMs of both: choose another cidr",
		},
		{
			name:    "an imported volume waits for the node's report",
			objs:    []client.Object{vol("root", ""), imported(vol("data", "node2"), "legacy.qcow2"), vnet("net-db")},
			wantErr: "Volume data has not imported volume legacy.qcow2 of node node2 yet",
		},
		{
			name: "an imported volume only observed is never attached",
			objs: []client.Object{vol("root", ""), observed(importedBy(vol("data", "node2"), "legacy.qcow2")), vnet("net-db")},
			wantErr: "Volume data only observes volume legacy.qcow2 of node node2 (its managementPolicies allow neither Create nor Update); " +
				"a VirtualMachine attaches an imported Volume only when virtfleet may change the volume",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d, err := resolve(context.Background(), kube(t, tc.objs...), vm(), nil)
			if tc.wantErr != "" {
				require.EqualError(t, err, tc.wantErr)
				return
			}
			if tc.wantMissing != nil {
				var missing *MissingError
				require.ErrorAs(t, err, &missing)
				assert.Equal(t, tc.wantMissing, missing)
				assert.Contains(t, err.Error(), "Volume root and VirtualNetwork net-db in namespace default")
				return
			}
			require.NoError(t, err)
			require.Len(t, d.volumes, 2)
			assert.Equal(t, "root", d.volumes[0].Name, "the first attachment is the boot disk")
			node, err := d.boundNode()
			if tc.wantNodeErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.wantNodeErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.wantNode, node)
		})
	}
}

func TestIntent(t *testing.T) {
	d := dependencies{
		volumes:  []v1alpha1.Volume{*vol("root", ""), *vol("data", "")},
		networks: []v1alpha1.VirtualNetwork{*vnet("net-db")},
	}
	cases := []struct {
		name  string
		vm    *v1alpha1.VirtualMachine
		check func(t *testing.T, in wire.Intent)
	}{
		{
			name: "the machine carries the resolved shape",
			vm:   vm(),
			check: func(t *testing.T, in wire.Intent) {
				assert.Equal(t, wire.ProtocolVersion, in.ProtocolVersion)
				assert.Equal(t, int64(3), in.Generation)
				assert.True(t, in.Running, "running defaults to true")
				assert.Equal(t, int32(3), in.Machine.VCPU)
				assert.Equal(t, int64(500<<20), in.Machine.MemoryBytes)
				assert.Equal(t, int64(1<<30), in.Machine.SwapBytes)
				assert.Equal(t, []wire.Disk{{Name: "root", VolumeUID: "uid-root", SizeBytes: 10 << 30}, {Name: "data", VolumeUID: "uid-data", SizeBytes: 10 << 30}}, in.Machine.Disks)
				assert.Equal(t, []wire.Network{{Name: "net-db", UID: "uid-net-db", Mode: "nat", CIDR: "10.10.120.0/24"}}, in.Machine.Networks)
			},
		},
		{
			name: "without maxima the node chooses them",
			vm:   vm(),
			check: func(t *testing.T, in wire.Intent) {
				assert.Zero(t, in.Machine.MaxVCPU)
				assert.Zero(t, in.Machine.MaxMemoryBytes)
			},
		},
		{
			name: "the VM's maxima reach the node",
			vm: vm(func(v *v1alpha1.VirtualMachine) {
				v.Spec.ForProvider.MaxVcpu = ptr.To[int32](6)
				v.Spec.ForProvider.MaxMemory = ptr.To(resource.MustParse("2Gi"))
			}),
			check: func(t *testing.T, in wire.Intent) {
				assert.Equal(t, int32(6), in.Machine.MaxVCPU)
				assert.Equal(t, int64(2<<30), in.Machine.MaxMemoryBytes)
			},
		},
		{
			name: "a VM of an instance type has the maxima recorded from it",
			vm: vm(func(v *v1alpha1.VirtualMachine) {
				v.Spec.ForProvider.Vcpu, v.Spec.ForProvider.Memory = 0, resource.Quantity{}
				v.Spec.ForProvider.Instancetype = &v1alpha1.InstancetypeRef{Name: "growable"}
				v.Status.InstancetypeRef = &v1alpha1.InstancetypeRevision{Name: "growable", Spec: v1alpha1.InstancetypeSpec{
					CPU:    v1alpha1.InstancetypeCPU{Guest: 2, MaxGuest: ptr.To[int32](8)},
					Memory: v1alpha1.InstancetypeMemory{Guest: resource.MustParse("1Gi"), MaxGuest: ptr.To(resource.MustParse("4Gi"))},
				}}
			}),
			check: func(t *testing.T, in wire.Intent) {
				assert.Equal(t, [4]int64{2, 8, 1 << 30, 4 << 30}, [4]int64{int64(in.Machine.VCPU), int64(in.Machine.MaxVCPU), in.Machine.MemoryBytes, in.Machine.MaxMemoryBytes})
			},
		},
		{
			name: "running false and the restart annotation reach the node",
			vm: vm(func(v *v1alpha1.VirtualMachine) {
				v.Spec.ForProvider.Running = new(bool)
				v.Annotations = map[string]string{v1alpha1.AnnotationRestartRequestedAt: "2026-11-22T12:00:00Z"}
			}),
			check: func(t *testing.T, in wire.Intent) {
				assert.False(t, in.Running)
				assert.Equal(t, "2026-11-22T12:00:00Z", in.RestartNonce)
			},
		},
		{
			name: "the paused and reset annotations reach the node",
			vm: vm(func(v *v1alpha1.VirtualMachine) {
				v.Annotations = map[string]string{v1alpha1.AnnotationPaused: "true", v1alpha1.AnnotationResetRequestedAt: "2026-11-22T12:01:00Z"}
			}),
			check: func(t *testing.T, in wire.Intent) {
				assert.True(t, in.Running, "a pause is no stop")
				assert.True(t, in.Paused)
				assert.Equal(t, "2026-11-22T12:01:00Z", in.ResetNonce)
				assert.Empty(t, in.RestartNonce, "a reset is not a restart")
			},
		},
		{
			name: "a paused annotation other than true pauses nothing",
			vm: vm(func(v *v1alpha1.VirtualMachine) {
				v.Annotations = map[string]string{v1alpha1.AnnotationPaused: "false"}
			}),
			check: func(t *testing.T, in wire.Intent) {
				assert.False(t, in.Paused)
				assert.Empty(t, in.ResetNonce)
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.check(t, intent(tc.vm, d))
		})
	}

	t.Run("imports go by their external names, an imported volume at its real size", func(t *testing.T) {
		n := vnet("lab")
		meta.SetExternalName(n, "default")
		in := intent(vm(), dependencies{
			volumes:  []v1alpha1.Volume{*vol("root", ""), *importedBy(vol("data", "node2"), "legacy.qcow2")},
			networks: []v1alpha1.VirtualNetwork{*n},
		})
		assert.Equal(t, []wire.Disk{
			{Name: "root", VolumeUID: "uid-root", SizeBytes: 10 << 30},
			{Name: "data", VolumeUID: "uid-data", SizeBytes: 3 << 30, ExternalName: "legacy.qcow2"},
		}, in.Machine.Disks)
		assert.Equal(t, []wire.Network{{Name: "lab", UID: "uid-lab", Mode: "nat", CIDR: "10.10.120.0/24", ExternalName: "default"}}, in.Machine.Networks)
	})

	t.Run("addresses and VNIs reach the node; a VNI only where the node has a tunnel", func(t *testing.T) {
		n := vnet("net-db")
		n.Status.AtProvider.VNI = 7
		bridged := vnet("lan")
		bridged.Spec.ForProvider.Mode, bridged.Spec.ForProvider.CIDR, bridged.Spec.ForProvider.Bridge = v1alpha1.NetworkModeBridge, "", "br0"
		bridged.Spec.ForProvider.VLAN = ptr.To[int32](100)
		base := dependencies{
			volumes:   []v1alpha1.Volume{*vol("root", "")},
			networks:  []v1alpha1.VirtualNetwork{*n, *bridged},
			addresses: map[string]netip.Prefix{"net-db": netip.MustParsePrefix("10.10.120.9/24")},
		}
		for _, tc := range []struct {
			overlay bool
			wantVNI int32
		}{{true, 7}, {false, 0}} {
			d := base
			d.overlay = tc.overlay
			nets := intent(vm(), d).Machine.Networks
			require.Len(t, nets, 2)
			assert.Equal(t, "10.10.120.9/24", nets[0].Address)
			assert.Equal(t, tc.wantVNI, nets[0].VNI)
			assert.Empty(t, nets[1].Address, "a host bridge's addresses are not the hub's")
			assert.Zero(t, nets[1].VNI)
			assert.Equal(t, int32(100), nets[1].VLAN, "the bridge's VLAN tag")
			assert.Zero(t, nets[0].VLAN)
		}
	})

	t.Run("a VM restarted elsewhere is fenced, only when all its disks are on shared pools", func(t *testing.T) {
		shared := func(v *v1alpha1.Volume) v1alpha1.Volume {
			v.Spec.ForProvider.StoragePool = "ceph"
			return *v
		}
		restart := func(v *v1alpha1.VirtualMachine) {
			v.Spec.ForProvider.Availability = ptr.To(v1alpha1.AvailabilityRestart)
		}
		onShared := dependencies{volumes: []v1alpha1.Volume{shared(vol("root", "")), shared(vol("data", ""))}}
		mixed := dependencies{volumes: []v1alpha1.Volume{shared(vol("root", "")), *vol("data", "")}}
		for _, tc := range []struct {
			name      string
			vm        *v1alpha1.VirtualMachine
			d         dependencies
			wantFence bool
		}{
			{"restart on shared pools", vm(restart), onShared, true},
			{"no availability", vm(), onShared, false},
			{"availability None", vm(func(v *v1alpha1.VirtualMachine) { v.Spec.ForProvider.Availability = ptr.To(v1alpha1.AvailabilityNone) }), onShared, false},
			{"a disk on the node's own storage", vm(restart), mixed, false},
			{"an imported guest", vm(restart, func(v *v1alpha1.VirtualMachine) { meta.SetExternalName(v, "legacy") }), onShared, false},
		} {
			in := intent(tc.vm, tc.d)
			assert.Equal(t, tc.wantFence, in.Fence, tc.name)
			assert.Equal(t, "ceph", in.Machine.Disks[0].Pool, "%s: the disk names its shared pool", tc.name)
		}
		assert.Empty(t, intent(vm(restart), mixed).Machine.Disks[1].Pool, "a disk on the node's own storage names none")
	})

	t.Run("the fingerprint changes with the nonce and only then", func(t *testing.T) {
		a, b := intent(vm(), d), intent(vm(), d)
		assert.Equal(t, fingerprint(a), fingerprint(b))
		b.RestartNonce = "now"
		assert.NotEqual(t, fingerprint(a), fingerprint(b))
	})

	// An annotation changes no generation: the intent is published again
	// only because its fingerprint differs from the one published.
	t.Run("the fingerprint changes with the pause and the reset annotations", func(t *testing.T) {
		base := fingerprint(intent(vm(), d))
		for _, a := range []map[string]string{
			{v1alpha1.AnnotationPaused: "true"},
			{v1alpha1.AnnotationResetRequestedAt: "now"},
		} {
			annotated := vm(func(v *v1alpha1.VirtualMachine) { v.Annotations = a })
			assert.NotEqual(t, base, fingerprint(intent(annotated, d)), "%v", a)
		}
	})
}

func TestNodeSelector(t *testing.T) {
	cases := []struct {
		name          string
		defaults, own map[string]string
		want          map[string]string
	}{
		{"no defaults keeps the VM's", nil, map[string]string{"zone": "a"}, map[string]string{"zone": "a"}},
		{"defaults apply", map[string]string{"team": "x"}, nil, map[string]string{"team": "x"}},
		{"the VM wins a conflict", map[string]string{"zone": "a", "team": "x"}, map[string]string{"zone": "b"}, map[string]string{"zone": "b", "team": "x"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, NodeSelector(tc.defaults, tc.own))
		})
	}
}

// volFrom is a Volume made from the DiskImage image.
func volFrom(name, node, image string) *v1alpha1.Volume {
	v := vol(name, node)
	v.Spec.ForProvider.Source = &v1alpha1.VolumeSource{DiskImageRef: &v1alpha1.LocalReference{Name: v1alpha1.LocalName(image)}}
	return v
}

// cloneImage is a DiskImage cloned from the Volume source.
func cloneImage(name, source string) *v1alpha1.DiskImage {
	return &v1alpha1.DiskImage{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID("uid-" + name)},
		Spec: v1alpha1.DiskImageSpec{ForProvider: v1alpha1.DiskImageParameters{
			Source: v1alpha1.DiskImageSource{VolumeRef: &v1alpha1.LocalReference{Name: v1alpha1.LocalName(source)}},
		}},
	}
}

func TestResolveClonedImages(t *testing.T) {
	machine := vm(func(m *v1alpha1.VirtualMachine) { m.Spec.ForProvider.VirtualNetworks = nil })
	deleting := vol("base", "node1")
	now := metav1.Now()
	deleting.DeletionTimestamp, deleting.Finalizers = &now, []string{"keep"}
	cases := []struct {
		name       string
		objs       []client.Object
		wantErr    string // from resolve: the VM waits
		wantNode   string
		wantBindTo string // from boundNode: the VM cannot be placed
	}{
		{
			name:    "a source on no node yet keeps the VM waiting and names the image and the Volume",
			objs:    []client.Object{volFrom("root", "", "golden"), vol("data", ""), cloneImage("golden", "base"), vol("base", "")},
			wantErr: "DiskImage golden clones Volume base, which is on no node yet; the VM waits until a VM using base is placed",
		},
		{
			name:    "a missing source keeps the VM waiting",
			objs:    []client.Object{volFrom("root", "", "golden"), vol("data", ""), cloneImage("golden", "base")},
			wantErr: "DiskImage golden clones Volume base, which does not exist",
		},
		{
			name:    "a source being deleted keeps the VM waiting",
			objs:    []client.Object{volFrom("root", "", "golden"), vol("data", ""), cloneImage("golden", "base"), deleting},
			wantErr: "DiskImage golden clones Volume base, which is being deleted",
		},
		{
			name:     "a bound source places the VM on its node",
			objs:     []client.Object{volFrom("root", "", "golden"), vol("data", ""), cloneImage("golden", "base"), vol("base", "node2")},
			wantNode: "node2",
		},
		{
			name:     "the VM's own volumes on the source's node agree",
			objs:     []client.Object{volFrom("root", "node2", "golden"), vol("data", "node2"), cloneImage("golden", "base"), vol("base", "node2")},
			wantNode: "node2",
		},
		{
			name:       "another volume of the VM on another node cannot be used with the clone",
			objs:       []client.Object{volFrom("root", "", "golden"), vol("data", "node1"), cloneImage("golden", "base"), vol("base", "node2")},
			wantBindTo: "DiskImage golden clones Volume base, which is on node2, but Volume data is on node1; a cloned image can only be made on its source's node and a VM can only use volumes of one node",
		},
		{
			name: "two clones of sources on different nodes cannot be used together",
			objs: []client.Object{
				volFrom("root", "", "golden"), volFrom("data", "", "silver"),
				cloneImage("golden", "base"), vol("base", "node1"), cloneImage("silver", "other"), vol("other", "node3"),
			},
			wantBindTo: "DiskImage golden clones Volume base, which is on node1, but DiskImage silver clones Volume other, which is on node3; a cloned image can only be made on its source's node and a VM runs on one node",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d, err := resolve(context.Background(), kube(t, tc.objs...), machine, nil)
			if tc.wantErr != "" {
				assert.EqualError(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			node, err := d.boundNode()
			if tc.wantBindTo != "" {
				assert.EqualError(t, err, tc.wantBindTo)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.wantNode, node)
		})
	}

	t.Run("the intent carries the source Volume's name and uid instead of a url", func(t *testing.T) {
		golden := cloneImage("golden", "base")
		golden.Spec.ForProvider.PruneAfter = &metav1.Duration{Duration: time.Hour}
		d, err := resolve(context.Background(), kube(t, volFrom("root", "", "golden"), vol("data", ""), golden, vol("base", "node2")), machine, nil)
		require.NoError(t, err)
		in := intent(machine, d)
		require.Len(t, in.Machine.Disks, 2)
		assert.Equal(t, &wire.ImageRef{
			Name: "golden", UID: "uid-golden", Format: "qcow2", PruneAfterSeconds: 3600,
			SourceVolume: &wire.SourceVolume{Name: "base", UID: "uid-base"},
		}, in.Machine.Disks[0].Image)
		assert.NoError(t, in.Machine.Disks[0].Image.Validate(), "the node accepts it")
		assert.Nil(t, in.Machine.Disks[1].Image)
	})
}

// madeOn is img Ready on nodes as its status says it: what the nodes
// reported, or, where none reports images (nova), what VMs said.
func madeOn(img *v1alpha1.DiskImage, nodes ...string) *v1alpha1.DiskImage {
	img.Status.AtProvider.Phase, img.Status.AtProvider.Nodes = v1alpha1.ImagePhaseReady, nodes
	return img
}

// heldBy says node holds the DiskImage of uid, as its own image report would.
func heldBy(node, uid string) holders {
	return func(u string) []string {
		if u != uid {
			return nil
		}
		return []string{node}
	}
}

// A clone needs its source only until its disk is made: then the source
// may go, and the VM goes on without it. A disk not made yet is made of
// the node's copy of the image, or waits: never made empty.
func TestResolveClonesMadeWithoutTheirSource(t *testing.T) {
	onNode2 := func(disks ...string) *v1alpha1.VirtualMachine {
		return vm(func(m *v1alpha1.VirtualMachine) {
			m.Spec.ForProvider.VirtualNetworks = nil
			m.Annotations = map[string]string{v1alpha1.AnnotationNode: "node2"}
			m.Status.AtProvider.Disks = disks
		})
	}
	made, unmade := onNode2("root", "data"), onNode2()
	deleting := vol("base", "node2")
	now := metav1.Now()
	deleting.DeletionTimestamp, deleting.Finalizers = &now, []string{"keep"}
	ownVolumes := []client.Object{volFrom("root", "node2", "golden"), vol("data", "node2")}
	held := &wire.ImageRef{Name: "golden", UID: "uid-golden", Format: "qcow2", Held: true}
	const waits = "DiskImage golden clones Volume base, which does not exist; Volume root is not made yet and its node node2 does not hold DiskImage golden to make it of"
	cases := []struct {
		name      string
		machine   *v1alpha1.VirtualMachine
		held      holders
		objs      []client.Object
		wantErr   string // from resolve: the VM waits; empty: it does not
		wantImage *wire.ImageRef
	}{
		{
			name:      "a made disk whose source is gone",
			machine:   made,
			objs:      []client.Object{madeOn(cloneImage("golden", "base"), "node2")},
			wantImage: held,
		},
		{
			name:      "a made disk whose source is being deleted",
			machine:   made,
			objs:      []client.Object{madeOn(cloneImage("golden", "base"), "node2"), deleting},
			wantImage: held,
		},
		{
			name:      "a made disk whose snapshot is gone",
			machine:   made,
			objs:      []client.Object{madeOn(snapshotImage("golden", "base", "monday"), "node2"), vol("base", "node2")},
			wantImage: held,
		},
		{
			name:    "a made disk whose source is there still names it",
			machine: made,
			objs:    []client.Object{madeOn(cloneImage("golden", "base"), "node2"), vol("base", "node2")},
			wantImage: &wire.ImageRef{
				Name: "golden", UID: "uid-golden", Format: "qcow2",
				SourceVolume: &wire.SourceVolume{Name: "base", UID: "uid-base"},
			},
		},
		{
			name:      "a new disk whose source is gone is made of the image its node holds",
			machine:   unmade,
			held:      heldBy("node2", "uid-golden"),
			objs:      []client.Object{cloneImage("golden", "base")},
			wantImage: held,
		},
		{
			// The hole: the image is on the node for another VM's disk,
			// and this VM's new disk was sent no image at all.
			name:    "a new disk whose image is Ready on its node only by the image's status waits",
			machine: unmade,
			objs:    []client.Object{madeOn(cloneImage("golden", "base"), "node2")},
			wantErr: waits,
		},
		{
			name:    "a new disk whose snapshot is gone waits",
			machine: unmade,
			objs:    []client.Object{madeOn(snapshotImage("golden", "base", "monday"), "node2"), vol("base", "node2")},
			wantErr: "DiskImage golden copies VirtualMachineSnapshot monday, which does not exist; Volume root is not made yet and its node node2 does not hold DiskImage golden to make it of",
		},
		{
			name:    "a new disk whose image another node holds waits",
			machine: unmade,
			held:    heldBy("node1", "uid-golden"),
			objs:    []client.Object{madeOn(cloneImage("golden", "base"), "node1")},
			wantErr: waits,
		},
		{
			name: "a disk another node's report lists is not made on the Volume's node",
			machine: vm(func(m *v1alpha1.VirtualMachine) {
				m.Spec.ForProvider.VirtualNetworks = nil
				m.Annotations = map[string]string{v1alpha1.AnnotationNode: "node1"}
				m.Status.AtProvider.Disks = []string{"root", "data"}
			}),
			objs:    []client.Object{madeOn(cloneImage("golden", "base"), "node2")},
			wantErr: waits,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d, err := resolve(context.Background(), kube(t, append(slices.Clone(ownVolumes), tc.objs...)...), tc.machine, tc.held)
			if tc.wantErr != "" {
				assert.EqualError(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			node, err := d.boundNode()
			require.NoError(t, err)
			assert.Equal(t, "node2", node, "where its disks are")
			in := intent(tc.machine, d)
			require.Len(t, in.Machine.Disks, 2)
			assert.Equal(t, tc.wantImage, in.Machine.Disks[0].Image)
			require.NoError(t, in.Machine.Disks[0].Image.Validate(), "a ref the node takes")
		})
	}
}

// A VM on no node whose new Volume is of a cloned image whose source is
// gone is placed only where the image is held: placement is told the
// holders, as it is told the node of bound Volumes, and the VM waits,
// naming the image, only while no node holds it.
func TestAnUnplacedCloneOfAnImageWhoseSourceIsGone(t *testing.T) {
	unplaced := vm(func(m *v1alpha1.VirtualMachine) { m.Spec.ForProvider.VirtualNetworks = nil })
	onNode2 := vm(func(m *v1alpha1.VirtualMachine) {
		m.Spec.ForProvider.VirtualNetworks = nil
		m.Annotations = map[string]string{v1alpha1.AnnotationNode: "node2"}
	})
	twoHolders := func(u string) []string {
		if u != "uid-golden" {
			return nil
		}
		return []string{"node2", "node3"}
	}
	newRoot := []client.Object{volFrom("root", "", "golden"), vol("data", "")}
	cases := []struct {
		name     string
		machine  *v1alpha1.VirtualMachine
		volumes  []client.Object
		held     holders
		wantErr  string
		wantHeld []placement.HeldImage
		// wantNode is the node the VM's Volumes bind it to.
		wantNode string
	}{
		{
			name:     "it is placed among the nodes holding the image",
			machine:  unplaced,
			volumes:  newRoot,
			held:     twoHolders,
			wantHeld: []placement.HeldImage{{Name: "golden", Nodes: []string{"node2", "node3"}}},
		},
		{
			name:    "no node holding the image keeps it waiting for the nodes that made it",
			machine: unplaced,
			volumes: newRoot,
			held:    heldBy("node1", "uid-other"),
			wantErr: "DiskImage golden clones Volume base, which does not exist; Volume root is not made yet and no node holds DiskImage golden to make it of: the VM waits for node1, node3, where it was made, to report it",
		},
		{
			name:     "a Volume bound to a holder binds the VM there, as any bound Volume does",
			machine:  unplaced,
			volumes:  []client.Object{volFrom("root", "node3", "golden"), vol("data", "")},
			held:     twoHolders,
			wantNode: "node3",
		},
		{
			name:    "placed on a holder, its Volume on no node yet is made there",
			machine: onNode2,
			volumes: newRoot,
			held:    twoHolders,
		},
		{
			name:    "placed on a node holding no copy, its Volume on no node yet waits",
			machine: onNode2,
			volumes: newRoot,
			held:    heldBy("node1", "uid-golden"),
			wantErr: "DiskImage golden clones Volume base, which does not exist; Volume root is not made yet and its node node2 does not hold DiskImage golden to make it of",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			objs := append(slices.Clone(tc.volumes), madeOn(cloneImage("golden", "base"), "node1", "node3"))
			d, err := resolve(context.Background(), kube(t, objs...), tc.machine, tc.held)
			if tc.wantErr != "" {
				assert.EqualError(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			req, err := request(tc.machine, d, nil)
			require.NoError(t, err)
			assert.Equal(t, tc.wantHeld, req.HeldImages, "the nodes placement may choose for the image")
			assert.Equal(t, tc.wantNode, req.RequiredNode)
			in := intent(tc.machine, d)
			assert.Equal(t, &wire.ImageRef{Name: "golden", UID: "uid-golden", Format: "qcow2", Held: true}, in.Machine.Disks[0].Image, "made of the node's copy, never empty")
		})
	}
}

// snapshotImage is a DiskImage copying the Volume source as it was in the
// VirtualMachineSnapshot snapshot.
func snapshotImage(name, source, snapshot string) *v1alpha1.DiskImage {
	img := cloneImage(name, source)
	img.Spec.ForProvider.Source.SnapshotRef = &v1alpha1.LocalReference{Name: v1alpha1.LocalName(snapshot)}
	return img
}

// vmSnapshot is a VirtualMachineSnapshot of VM web, whose disks are
// volumes, on node, in namespace; ready unless changed.
func vmSnapshot(namespace, name, node string, volumes []string, change ...func(*v1alpha1.VirtualMachineSnapshot)) *v1alpha1.VirtualMachineSnapshot {
	s := &v1alpha1.VirtualMachineSnapshot{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, UID: types.UID("uid-" + name)},
		Spec:       v1alpha1.VirtualMachineSnapshotSpec{VMName: "web"},
		Status: v1alpha1.VirtualMachineSnapshotStatus{
			Phase: v1alpha1.SnapshotSucceeded, ReadyToUse: true, Node: node, SourceUID: "uid-web",
			VM: &v1alpha1.VirtualMachineParameters{},
		},
	}
	for _, v := range volumes {
		s.Status.VM.DiskAttachments = append(s.Status.VM.DiskAttachments, v1alpha1.DiskAttachment{Name: v1alpha1.LocalName(v)})
	}
	for _, c := range change {
		c(s)
	}
	return s
}

func TestResolveImagesOfASnapshot(t *testing.T) {
	machine := vm(func(m *v1alpha1.VirtualMachine) { m.Spec.ForProvider.VirtualNetworks = nil })
	made := metav1.NewTime(time.Now().Truncate(time.Second))
	image := snapshotImage("golden", "base", "monday")
	image.CreationTimestamp = made
	base := []client.Object{volFrom("root", "", "golden"), vol("data", ""), image, vol("base", "node2")}
	cases := []struct {
		name    string
		objs    []client.Object
		wantErr string // from resolve: the VM waits; empty: it does not
	}{
		{
			name:    "a missing snapshot keeps the VM waiting",
			wantErr: "DiskImage golden copies VirtualMachineSnapshot monday, which does not exist",
		},
		{
			// Attacker: a tenant of namespace team-b names, in its own
			// DiskImage, the snapshot "monday" that exists only in
			// namespace default; the snapshot is read from the image's
			// namespace alone and is not found there.
			name:    "a snapshot of another namespace is never read",
			objs:    []client.Object{vmSnapshot("team-b", "monday", "node2", []string{"base"})},
			wantErr: "DiskImage golden copies VirtualMachineSnapshot monday, which does not exist",
		},
		{
			name: "a snapshot not ready to use keeps the VM waiting",
			objs: []client.Object{vmSnapshot("default", "monday", "node2", []string{"base"}, func(s *v1alpha1.VirtualMachineSnapshot) {
				s.Status.Phase, s.Status.ReadyToUse = v1alpha1.SnapshotInProgress, false
			})},
			wantErr: "DiskImage golden copies VirtualMachineSnapshot monday, which is not ready to use (it is InProgress)",
		},
		{
			name: "a snapshot deleted before the image was made keeps the VM waiting",
			objs: []client.Object{vmSnapshot("default", "monday", "node2", []string{"base"}, func(s *v1alpha1.VirtualMachineSnapshot) {
				s.DeletionTimestamp, s.Finalizers = ptr.To(metav1.NewTime(made.Add(-time.Hour))), []string{"keep"}
			})},
			wantErr: "DiskImage golden copies VirtualMachineSnapshot monday, which is being deleted",
		},
		{
			// Its deletion waits for the image (the snapshot
			// controller's hold), so the image is made from it.
			name: "a snapshot deleted after the image was made is still copied from",
			objs: []client.Object{vmSnapshot("default", "monday", "node2", []string{"base"}, func(s *v1alpha1.VirtualMachineSnapshot) {
				s.DeletionTimestamp, s.Finalizers = ptr.To(metav1.NewTime(made.Add(time.Second))), []string{"keep"}
			})},
		},
		{
			name:    "a snapshot of other disks is not copied from",
			objs:    []client.Object{vmSnapshot("default", "monday", "node2", []string{"web-root"})},
			wantErr: "DiskImage golden copies Volume base as it was in VirtualMachineSnapshot monday, which does not hold it: that snapshot is of VirtualMachine web's disks",
		},
		{
			name:    "a snapshot on another node than its Volume is not copied from",
			objs:    []client.Object{vmSnapshot("default", "monday", "node1", []string{"base"})},
			wantErr: "DiskImage golden copies Volume base, on node node2, as it was in VirtualMachineSnapshot monday, which is on node node1",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := resolve(context.Background(), kube(t, append(slices.Clone(base), tc.objs...)...), machine, nil)
			if tc.wantErr == "" {
				assert.NoError(t, err)
				return
			}
			assert.EqualError(t, err, tc.wantErr)
		})
	}

	t.Run("the intent carries the Volume and the snapshot's uid, and no sourceVolume", func(t *testing.T) {
		objs := append(slices.Clone(base), vmSnapshot("default", "monday", "node2", []string{"base"}))
		d, err := resolve(context.Background(), kube(t, objs...), machine, nil)
		require.NoError(t, err)
		node, err := d.boundNode()
		require.NoError(t, err)
		assert.Equal(t, "node2", node, "the image is made where the snapshot is")
		in := intent(machine, d)
		assert.Equal(t, &wire.ImageRef{
			Name: "golden", UID: "uid-golden", Format: "qcow2",
			SourceSnapshot: &wire.SourceSnapshot{Volume: wire.SourceVolume{Name: "base", UID: "uid-base"}, Snapshot: "uid-monday"},
		}, in.Machine.Disks[0].Image)
		assert.NoError(t, in.Machine.Disks[0].Image.Validate(), "the node accepts it")
	})
}

func TestCloneUsersOfWakesTheVMsWaitingForTheSource(t *testing.T) {
	s := runtime.NewScheme()
	require.NoError(t, v1alpha1.AddToScheme(s))
	waiting := vm(func(m *v1alpha1.VirtualMachine) {
		m.Name = "b"
		m.Spec.ForProvider.DiskAttachments = []v1alpha1.DiskAttachment{{Name: "b-root"}}
	})
	other := vm(func(m *v1alpha1.VirtualMachine) {
		m.Name, m.UID = "c", "uid-c"
		m.Spec.ForProvider.DiskAttachments = []v1alpha1.DiskAttachment{{Name: "c-root"}}
	})
	kube := fake.NewClientBuilder().WithScheme(s).
		WithIndex(&v1alpha1.VirtualMachine{}, index.VolumeUsers.Index, index.VolumeUsers.Uses).
		WithIndex(&v1alpha1.Volume{}, index.ImageUsers.Index, index.ImageUsers.Uses).
		WithObjects(waiting, other, volFrom("b-root", "", "golden"), volFrom("c-root", "", "silver"),
			cloneImage("golden", "a-root"), cloneImage("silver", "elsewhere"), vol("a-root", "node1")).
		Build()

	got := cloneUsersOf(context.Background(), kube, vol("a-root", "node1"))
	assert.Equal(t, []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: "default", Name: "b"}}}, got,
		"the VM whose Volume is made from a clone of a-root, and no other")
	assert.Empty(t, cloneUsersOf(context.Background(), kube, vol("b-root", "")), "no image clones b-root")
}
