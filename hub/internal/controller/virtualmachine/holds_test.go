package virtualmachine

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/bus"
	"github.com/virtfleet/virtfleet/hub/internal/fleet/fleettest"
)

// TestUnmetNamesTheField pins which field a VM is told its node no longer
// fits, and that a node the hub has not heard of, or a VM under a
// migration, is not refused for it.
func TestUnmetNamesTheField(t *testing.T) {
	b := bus.NewFake()
	f := fleettest.Start(t, b)
	b.SetNode(bus.NodeEvent{Node: testNode, Heartbeat: wire.NodeHeartbeat{Node: testNode, Backend: "libvirt", Labels: map[string]string{"zone": "a"}, SharedPools: []string{"ceph"}}})
	require.Eventually(t, func() bool { _, ok := f.Heard(testNode); return ok }, 5*time.Second, time.Millisecond)
	selecting := func(sel map[string]string) *v1alpha1.VirtualMachine {
		return vm(func(v *v1alpha1.VirtualMachine) { v.Spec.ForProvider.NodeSelector = sel })
	}
	inPool := dependencies{volumes: []v1alpha1.Volume{{
		ObjectMeta: metav1.ObjectMeta{Name: "root"},
		Spec:       v1alpha1.VolumeSpec{ForProvider: v1alpha1.VolumeParameters{Size: resource.MustParse("1Gi"), StoragePool: "nfs"}},
	}}}
	cases := map[string]struct {
		vm        *v1alpha1.VirtualMachine
		d         dependencies
		defaults  map[string]string
		node      string
		wantField string
	}{
		"StillFits":                     {vm: selecting(map[string]string{"zone": "a"}), node: testNode},
		"ItsOwnSelectorChanged":         {vm: selecting(map[string]string{"zone": "b"}), node: testNode, wantField: "spec.forProvider.nodeSelector"},
		"TheProviderConfigsSelector":    {vm: selecting(nil), defaults: map[string]string{"rack": "r1"}, node: testNode, wantField: "the nodeSelector of the VM's ProviderConfig"},
		"AVolumeInAPoolTheNodeLacks":    {vm: selecting(nil), d: inPool, node: testNode, wantField: "spec.forProvider.diskAttachments"},
		"ANodeNeverHeardOfIsNotRefused": {vm: selecting(map[string]string{"zone": "b"}), node: "node-unheard"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			e := &external{fleet: f, defaults: tc.defaults}
			err := e.unmet(tc.vm, tc.d, tc.node)
			if tc.wantField == "" {
				assert.NoError(t, err)
				return
			}
			var u *UnmetError
			require.ErrorAs(t, err, &u)
			assert.Contains(t, u.Field, tc.wantField)
			assert.Contains(t, err.Error(), "the guest runs on as last published")
		})
	}
}
