package virtualmachine

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
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
	return fake.NewClientBuilder().WithScheme(s).WithObjects(objs...).Build()
}

func TestResolve(t *testing.T) {
	cases := []struct {
		name        string
		objs        []client.Object
		wantMissing *MissingError
		wantNode    string
		wantNodeErr string
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
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d, err := resolve(context.Background(), kube(t, tc.objs...), vm())
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
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.check(t, intent(tc.vm, d))
		})
	}

	t.Run("the fingerprint changes with the nonce and only then", func(t *testing.T) {
		a, b := intent(vm(), d), intent(vm(), d)
		assert.Equal(t, fingerprint(a), fingerprint(b))
		b.RestartNonce = "now"
		assert.NotEqual(t, fingerprint(a), fingerprint(b))
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
			assert.Equal(t, tc.want, nodeSelector(tc.defaults, tc.own))
		})
	}
}
