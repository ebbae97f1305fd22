package virtualmachine

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/event"
	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/bus"
	"github.com/virtfleet/virtfleet/hub/internal/perobject"
	"github.com/virtfleet/virtfleet/hub/internal/placement"
	"github.com/virtfleet/virtfleet/hub/internal/wake"
)

func TestObserveRelease(t *testing.T) {
	b := bus.NewFake()
	e := testExternal(t, b, event.NewNopRecorder(), wake.NewNotifier(perobject.NewOwner(nil)))
	e.opts.Placer = placement.New()
	vm := &v1alpha1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{
		Namespace: "default", Name: "web", UID: types.UID(testUID),
		Annotations: map[string]string{v1alpha1.AnnotationNode: testNode},
	}}
	ctx := context.Background()

	_, err := e.observeRelease(ctx, vm, testNode)
	var releasing *ReleasingError
	require.True(t, errors.As(err, &releasing), "waits for the node: %v", err)
	in, ok := bus.Stored(b, wire.GuestIntents, testNode, testUID)
	require.True(t, ok)
	assert.True(t, in.Release, "the intent is replaced by a release marker")
	assert.Equal(t, e.fleet.OrphanSeal(testUID, testNode, vm.Namespace, vm.Name), in.Seal, "sealed, for the node to report with its orphan")
	assert.Empty(t, in.Machine.Disks)

	bus.SetValue(b, wire.GuestReports, testNode, testUID, wire.Report{
		ProtocolVersion: wire.ProtocolVersion, UID: testUID, Node: testNode, Phase: wire.PhaseRunning,
		Released: true, Orphan: &wire.Orphan{Namespace: "default", Name: "web", Seal: in.Seal},
	})
	require.Eventually(t, func() bool { r, ok := e.fleet.Guests.Report(testNode, testUID); return ok && r.Report.Released }, 5*time.Second, time.Millisecond)
	obs, err := e.observeRelease(ctx, vm, testNode)
	require.NoError(t, err)
	assert.False(t, obs.ResourceExists, "released: the VM may go")
	_, ok = bus.Stored(b, wire.GuestIntents, testNode, testUID)
	assert.False(t, ok, "and nothing of it is left in NATS but the node's report")

	o, found, err := e.fleet.Orphan("default", "web")
	require.NoError(t, err)
	require.True(t, found, "a VM of that name finds the orphan")
	assert.Equal(t, testNode, o.Node)
	assert.Equal(t, testUID, o.UID)
}

func TestIntentClaims(t *testing.T) {
	observe := xpv2.ManagementPolicies{xpv2.ManagementActionObserve}
	cases := map[string]struct {
		annotations map[string]string
		policies    xpv2.ManagementPolicies
		want        *wire.Claim
		observeOnly bool
	}{
		"ANewVMClaimsNothing":                   {policies: xpv2.ManagementPolicies{xpv2.ManagementActionAll}},
		"AnAdoptedOrphanIsClaimedByItsUID":      {annotations: map[string]string{v1alpha1.AnnotationAdopted: "old"}, want: &wire.Claim{Orphan: "old"}},
		"AnExternalNameImports":                 {annotations: map[string]string{meta.AnnotationKeyExternalName: "db"}, want: &wire.Claim{ExternalName: "db"}},
		"ObserveOnlyImportsCarryNoMachine":      {annotations: map[string]string{meta.AnnotationKeyExternalName: "db"}, policies: observe, want: &wire.Claim{ExternalName: "db"}, observeOnly: true},
		"ObserveOnlyWithoutAGuestToClaimIsNone": {policies: observe},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			vm := &v1alpha1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web", UID: "u", Annotations: tc.annotations}}
			vm.Spec.ForProvider.Vcpu = 1
			vm.SetManagementPolicies(tc.policies)
			in := intent(vm, dependencies{})
			assert.Equal(t, tc.want, in.Claim)
			assert.Equal(t, tc.observeOnly, in.ObserveOnly)
			if tc.observeOnly {
				assert.Zero(t, in.Machine.VCPU, "an observing intent carries no machine")
			}
		})
	}
}
