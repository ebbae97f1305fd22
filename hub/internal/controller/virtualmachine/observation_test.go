package virtualmachine

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
)

func TestIPSummary(t *testing.T) {
	iface := func(network string, ips ...string) wire.Interface {
		return wire.Interface{Network: network, IPs: ips, Source: wire.AddressSourceLease}
	}
	cases := []struct {
		name     string
		ifaces   []wire.Interface
		networks []v1alpha1.LocalName
		want     string
	}{
		{
			name:     "seed format in spec order, not report order",
			ifaces:   []wire.Interface{iface("net-backend", "10.10.150.12"), iface("net-db", "10.10.120.21")},
			networks: []v1alpha1.LocalName{"net-db", "net-backend"},
			want:     "net-db(10.10.120.21), net-backend(10.10.150.12)",
		},
		{
			name:     "IPv4 preferred over an IPv6 listed first",
			ifaces:   []wire.Interface{iface("net-db", "fd00::15", "10.10.120.21")},
			networks: []v1alpha1.LocalName{"net-db"},
			want:     "net-db(10.10.120.21)",
		},
		{
			name:     "IPv6 only is shown",
			ifaces:   []wire.Interface{iface("net-db", "fd00::15")},
			networks: []v1alpha1.LocalName{"net-db"},
			want:     "net-db(fd00::15)",
		},
		{
			name:     "network without an address yet is left out",
			ifaces:   []wire.Interface{iface("net-db", "10.10.120.21"), iface("net-backend")},
			networks: []v1alpha1.LocalName{"net-db", "net-backend"},
			want:     "net-db(10.10.120.21)",
		},
		{
			name:     "interfaces on networks the spec no longer names are not summarised",
			ifaces:   []wire.Interface{iface("old-net", "10.0.0.5")},
			networks: []v1alpha1.LocalName{"net-db"},
			want:     "",
		},
		{
			name: "no interfaces, no summary",
			want: "",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, ipSummary(tc.ifaces, tc.networks))
		})
	}
}

func TestObservationCarriesTheReport(t *testing.T) {
	seen := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	r := wire.Report{
		UID: "u1", ObservedGeneration: 4, Phase: wire.PhaseRunning, ID: "u1", Node: "node2",
		RestartCount: 2, RestartRequired: true,
		VCPU: 3, MaxVCPU: 8, MemoryBytes: 768 << 20, MaxMemoryBytes: 2 << 30,
		Disks:      []string{"root", "data"},
		Interfaces: []wire.Interface{{Network: "net-db", MAC: "52:54:00:00:00:01", IPs: []string{"10.10.120.21"}, Source: wire.AddressSourceGuestAgent, LastSeen: seen}},
	}
	o := observation(r, []v1alpha1.LocalName{"net-db"})
	assert.Equal(t, v1alpha1.PhaseRunning, o.Phase)
	assert.Equal(t, "node2", o.Node)
	assert.Equal(t, "u1", o.ID)
	assert.Equal(t, int32(2), o.RestartCount)
	assert.Equal(t, int64(4), o.ObservedGeneration)
	assert.True(t, o.RestartRequired)
	assert.Equal(t, "net-db(10.10.120.21)", o.IP)
	assert.Equal(t, int32(3), o.Vcpu, "the running shape")
	assert.Equal(t, int32(8), o.MaxVcpu)
	assert.Equal(t, []string{"root", "data"}, o.Disks, "the disks the guest has")
	if assert.NotNil(t, o.Memory) && assert.NotNil(t, o.MaxMemory) {
		assert.Equal(t, "768Mi", o.Memory.String())
		assert.Equal(t, "2Gi", o.MaxMemory.String())
	}
	if assert.Len(t, o.Interfaces, 1) {
		assert.Equal(t, v1alpha1.AddressSourceGuestAgent, o.Interfaces[0].Source)
		assert.Equal(t, "52:54:00:00:00:01", o.Interfaces[0].MAC)
		if assert.NotNil(t, o.Interfaces[0].LastSeen) {
			assert.True(t, o.Interfaces[0].LastSeen.Time.Equal(seen))
		}
	}
}

func TestAPIPhaseKeepsKnownPhasesAndShowsOthersUnknown(t *testing.T) {
	for _, p := range wire.Phases {
		assert.Equal(t, string(p), string(apiPhase(p)), "a known phase keeps its name")
	}
	assert.Equal(t, v1alpha1.PhaseUnknown, apiPhase("Hibernating"), "a phase from a newer node the CRD would refuse")
}

// TestDeclaredIsWhatTheVMAsks: the declared shape is the VM's own, or
// its recorded instance type's, maxima included when set.
func TestDeclaredIsWhatTheVMAsks(t *testing.T) {
	own := vm(func(v *v1alpha1.VirtualMachine) { v.Spec.ForProvider.MaxVcpu = ptr.To[int32](6) })
	d := declared(own)
	require.NotNil(t, d)
	assert.Equal(t, int32(3), d.Vcpu)
	assert.Equal(t, "500Mi", d.Memory.String())
	assert.Equal(t, int32(6), d.MaxVcpu)
	assert.Nil(t, d.MaxMemory, "left to the node")

	typed := vm(func(v *v1alpha1.VirtualMachine) {
		v.Spec.ForProvider.Vcpu, v.Spec.ForProvider.Memory = 0, resource.Quantity{}
		v.Spec.ForProvider.Instancetype = &v1alpha1.InstancetypeRef{Name: "growable"}
	})
	assert.Nil(t, declared(typed), "no shape before the type is recorded")
	typed.Status.InstancetypeRef = &v1alpha1.InstancetypeRevision{Name: "growable", Spec: v1alpha1.InstancetypeSpec{
		CPU:    v1alpha1.InstancetypeCPU{Guest: 2},
		Memory: v1alpha1.InstancetypeMemory{Guest: resource.MustParse("1Gi"), MaxGuest: ptr.To(resource.MustParse("4Gi"))},
	}}
	d = declared(typed)
	require.NotNil(t, d)
	assert.Equal(t, int32(2), d.Vcpu)
	assert.Zero(t, d.MaxVcpu)
	assert.Equal(t, "4Gi", d.MaxMemory.String())
}
