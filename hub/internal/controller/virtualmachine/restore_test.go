package virtualmachine

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	apisv1alpha1 "github.com/virtfleet/virtfleet/apis/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/bus"
	"github.com/virtfleet/virtfleet/hub/internal/fleet"
	"github.com/virtfleet/virtfleet/hub/internal/fleet/fleettest"
	"github.com/virtfleet/virtfleet/hub/internal/perobject"
	"github.com/virtfleet/virtfleet/hub/internal/wake"
)

// The intent published to a VM's node carries the restore the hub sealed
// on the VM, and nothing for one it did not seal, nor to a node that
// keeps no snapshots, nor during a migration.
func TestThePublishedIntentCarriesASealedRestore(t *testing.T) {
	r := Restore{ID: "restore-uid", Snapshot: "snap-uid"}
	cases := map[string]struct {
		// seal is the AnnotationRestoreSeal the VM carries.
		seal func(f *fleet.Fleet) string
		// noSnapshots has the node announce no snapshots.
		noSnapshots bool
		// migrating marks the VM as moving live to node2.
		migrating bool
		want      *wire.Restore
	}{
		"ASealedRestoreIsCarried": {
			seal: func(f *fleet.Fleet) string { return RestoreSeal(f, testUID, r) },
			want: &wire.Restore{ID: "restore-uid", Snapshot: "snap-uid"},
		},
		"AHandWrittenRestoreIsIgnored": {
			seal: func(*fleet.Fleet) string { return "forged" },
		},
		"ARestoreSealedForAnotherVMIsIgnored": {
			seal: func(f *fleet.Fleet) string { return RestoreSeal(f, "another-uid", r) },
		},
		"AMigrationsSealIsNoRestoresSeal": {
			seal: func(f *fleet.Fleet) string {
				return MigrationSeal(f, testUID, Migration{ID: r.ID, Target: r.Snapshot})
			},
		},
		"ANodeThatKeepsNoSnapshotsIsToldNothing": {
			seal:        func(f *fleet.Fleet) string { return RestoreSeal(f, testUID, r) },
			noSnapshots: true,
		},
		"NothingDuringAMigration": {
			seal:      func(f *fleet.Fleet) string { return RestoreSeal(f, testUID, r) },
			migrating: true,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			b := bus.NewFake()
			e := testExternal(t, b, &fleettest.Recorder{}, wake.NewNotifier(perobject.NewOwner(nil)))
			b.SetNode(bus.NodeEvent{Node: testNode, Heartbeat: wire.NodeHeartbeat{Backend: "libvirt", Snapshots: !tc.noSnapshots}})
			require.Eventually(t, func() bool { _, ok := e.fleet.Heard(testNode); return ok }, 5*time.Second, time.Millisecond)
			vm := &v1alpha1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web", UID: testUID, Annotations: map[string]string{
				v1alpha1.AnnotationNode: testNode, v1alpha1.AnnotationSeal: e.fleet.Seal(testUID, testNode, ""),
				v1alpha1.AnnotationRestore: r.String(), v1alpha1.AnnotationRestoreSeal: tc.seal(e.fleet),
			}}}
			if tc.migrating {
				m := Migration{ID: "m1", Target: "node2"}
				vm.Annotations[v1alpha1.AnnotationMigration], vm.Annotations[v1alpha1.AnnotationMigrationSeal] = m.String(), MigrationSeal(e.fleet, testUID, m)
			}
			vm.Spec.ForProvider.Vcpu, vm.Spec.ForProvider.Memory = 1, resource.MustParse("1Gi")
			_, sealed := RestoreOf(vm, e.fleet)
			assert.Equal(t, tc.want != nil || tc.noSnapshots || tc.migrating, sealed, "RestoreOf")

			require.NoError(t, e.publish(t.Context(), vm, dependencies{}, testNode))

			in, ok := bus.Stored(b, wire.GuestIntents, testNode, testUID)
			require.True(t, ok, "the intent is published")
			assert.Equal(t, tc.want, in.Restore)
		})
	}
}

// A node annotation the hub did not seal counts as the VM's node only
// where the VM controller would publish there: its namespace may choose
// nodes, or the node runs this very guest.
func TestAdmittedNode(t *testing.T) {
	cases := map[string]struct {
		sealed     bool
		chooseNode bool
		reported   bool
		wantNode   string
		wantErr    string
	}{
		"SealedByThePlacement":       {sealed: true, wantNode: testNode},
		"WrittenByHand":              {wantErr: "VirtualMachine web is not admitted to node node1: refused"},
		"ChosenWhereTheGrantAllowIt": {chooseNode: true, wantNode: testNode},
		"RunningThereFromBeforeSeals": {
			reported: true, wantNode: testNode,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			b := bus.NewFake()
			e := testExternal(t, b, &fleettest.Recorder{}, wake.NewNotifier(perobject.NewOwner(nil)))
			if tc.reported {
				report(t, b, e.fleet, "")
			}
			vm := &v1alpha1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web", UID: testUID, Annotations: map[string]string{v1alpha1.AnnotationNode: testNode}}}
			if tc.sealed {
				vm.Annotations[v1alpha1.AnnotationSeal] = e.fleet.Seal(testUID, testNode, "")
			}
			cpc := &apisv1alpha1.ClusterProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: "default"}}
			if tc.chooseNode {
				cpc.Spec.Grants = []apisv1alpha1.TenantGrant{{Namespaces: []string{"default"}, ChooseNode: true}}
			}
			s := runtime.NewScheme()
			require.NoError(t, apisv1alpha1.AddToScheme(s))
			kube := fake.NewClientBuilder().WithScheme(s).WithObjects(cpc).Build()

			node, err := AdmittedNode(t.Context(), kube, vm, e.fleet)

			if tc.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.wantErr)
			} else {
				require.NoError(t, err)
			}
			assert.Equal(t, tc.wantNode, node)
		})
	}
}
