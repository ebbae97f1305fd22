package virtualmachine

import (
	"cmp"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/crossplane/crossplane-runtime/v2/pkg/event"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/bus"
	"github.com/virtfleet/virtfleet/hub/internal/controller/index"
	"github.com/virtfleet/virtfleet/hub/internal/fleet/fleettest"
	"github.com/virtfleet/virtfleet/hub/internal/perobject"
	"github.com/virtfleet/virtfleet/hub/internal/placement"
	"github.com/virtfleet/virtfleet/hub/internal/wake"
)

// The lease the lost node announces, the hub's margin and the shared pool
// of the tests below.
const (
	testLease  = 20 * time.Second
	testMargin = 5 * time.Second
	testPool   = "shared"
)

// roomy is the heartbeat of a live node with room for the test VM that
// reaches the shared pool.
func roomy(pools ...string) wire.NodeHeartbeat {
	return wire.NodeHeartbeat{Backend: "libvirt", Capacity: wire.Resources{VCPU: 8, MemoryBytes: 16 << 30}, SharedPools: pools}
}

func TestRestartElsewhere(t *testing.T) {
	restart := v1alpha1.AvailabilityRestart
	cases := map[string]struct {
		// availability of the VM; Restart unless noAvailability.
		noAvailability bool
		// fenceAfter is the lost node's lease in its last heartbeat.
		fenceAfter time.Duration
		// local puts the VM's Volume on its node's own storage.
		local bool
		// volumeOn is the node the Volume is bound to; the lost node when
		// empty.
		volumeOn string
		// observed is the generation node1 last reported; the VM's when 0.
		observed int64
		// migrating marks the VM as moving live to node2.
		migrating bool
		// removed deletes the lost node's HypervisorNode, an
		// administrator's removal of the node for good.
		removed bool
		// snapshots are the VM's snapshots, by name, and the phase each
		// shows; each is on the lost node.
		snapshots map[string]v1alpha1.SnapshotPhase
		// others are the live nodes besides the lost node1.
		others map[string]wire.NodeHeartbeat
		// group is the PlacementGroup the VM names, made unless
		// groupGone; groupMembers the nodes of its other VMs.
		group        *v1alpha1.PlacementGroupSpec
		groupGone    bool
		groupMembers []string
		// after is how long after the deadline (last heartbeat + lease +
		// margin) the reconcile runs; negative is before.
		after time.Duration

		// wantNode is where the VM and its Volume are after; node1 when
		// empty (they stay).
		wantNode string
		// wantEvents are the events recorded, by reason.
		wantEvents []event.Reason
		// wantNote is part of what the NodeLost condition says after.
		wantNote   string
		wantWakeUp bool
		// wantLost is part of the NodeLost event of a VM that moved; the
		// lease's run out when empty.
		wantLost string
	}{
		"BeforeTheDeadlineNothingMovesAndTheVMIsWokenAtIt": {
			fenceAfter: testLease,
			others:     map[string]wire.NodeHeartbeat{"node2": roomy(testPool)},
			after:      -300 * time.Millisecond,
			wantNote:   "the VM is restarted on another node at ",
			wantWakeUp: true,
		},
		"AfterTheDeadlineTheVMAndItsSharedVolumeMoveToALiveNode": {
			fenceAfter: testLease,
			others:     map[string]wire.NodeHeartbeat{"node2": roomy(testPool)},
			after:      time.Second,
			wantNode:   "node2",
			wantEvents: []event.Reason{ReasonNodeLost, ReasonRestartedElsewhere},
		},
		"AVMWithSnapshotsComesBackAndItsSnapshotsAreSaidLost": {
			fenceAfter: testLease,
			snapshots:  map[string]v1alpha1.SnapshotPhase{"before": v1alpha1.SnapshotSucceeded, "nightly": v1alpha1.SnapshotSucceeded, "broken": v1alpha1.SnapshotFailed},
			others:     map[string]wire.NodeHeartbeat{"node2": roomy(testPool)},
			after:      time.Second,
			wantNode:   "node2",
			wantEvents: []event.Reason{ReasonNodeLost, ReasonRestartedElsewhere, ReasonSnapshotsLost},
			wantNote:   "snapshots before, nightly stayed on lost node node1 and are lost",
		},
		"ANodeThatDoesNotReachTheSharedPoolIsPassedOver": {
			fenceAfter: testLease,
			others:     map[string]wire.NodeHeartbeat{"node2": roomy(), "node3": roomy("other", testPool)},
			after:      time.Second,
			wantNode:   "node3",
			wantEvents: []event.Reason{ReasonNodeLost, ReasonRestartedElsewhere},
		},
		"AVolumeAnEarlierTryMovedTakesTheVMToItsNode": {
			fenceAfter: testLease,
			volumeOn:   "node3",
			others:     map[string]wire.NodeHeartbeat{"node2": roomy(testPool), "node3": roomy(testPool)},
			after:      time.Second,
			wantNode:   "node3",
			wantEvents: []event.Reason{ReasonNodeLost, ReasonRestartedElsewhere},
		},
		"ANodeThatDoesNotFenceItselfNeverHasItsVMsRestarted": {
			others:     map[string]wire.NodeHeartbeat{"node2": roomy(testPool)},
			after:      time.Hour,
			wantEvents: []event.Reason{ReasonNotRestarted},
			wantNote:   "node node1 does not fence itself (FenceAfter 0); the VM is not restarted elsewhere",
		},
		"AVolumeOnTheNodesOwnStorageKeepsTheVMThere": {
			fenceAfter: testLease,
			local:      true,
			others:     map[string]wire.NodeHeartbeat{"node2": roomy(testPool)},
			after:      time.Second,
			wantEvents: []event.Reason{ReasonNotRestarted},
			wantNote:   "cannot restart elsewhere: Volume root is on node node1's own storage",
		},
		"TheLostNodeIsNeverChosenEvenWhenNoOtherNodeHasRoom": {
			fenceAfter: testLease,
			others:     map[string]wire.NodeHeartbeat{"node2": {Backend: "libvirt", Capacity: wire.Resources{VCPU: 1, MemoryBytes: 512 << 20}, SharedPools: []string{testPool}}},
			after:      time.Second,
			wantEvents: []event.Reason{ReasonNotRestarted},
			wantNote:   "the VM is restarted on another node as soon as one can take it: no node fits: node2: ",
		},
		"ARequiredSpreadGroupPassesOverTheNodeOfAnotherMember": {
			fenceAfter:   testLease,
			others:       map[string]wire.NodeHeartbeat{"node2": roomy(testPool), "node3": roomy(testPool)},
			group:        &v1alpha1.PlacementGroupSpec{Policy: v1alpha1.PlacementAntiAffinity},
			groupMembers: []string{"node2"},
			after:        time.Second,
			wantNode:     "node3",
			wantEvents:   []event.Reason{ReasonNodeLost, ReasonRestartedElsewhere},
		},
		"ARequiredSpreadGroupWithAMemberOnEveryLiveNodeKeepsTheVMDown": {
			fenceAfter:   testLease,
			others:       map[string]wire.NodeHeartbeat{"node2": roomy(testPool)},
			group:        &v1alpha1.PlacementGroupSpec{Policy: v1alpha1.PlacementAntiAffinity},
			groupMembers: []string{"node2"},
			after:        time.Second,
			wantEvents:   []event.Reason{ReasonNotRestarted},
			wantNote:     "no node fits: node2: placement group web (anti-affinity) has a VM in node node2 already",
		},
		"AGroupDeletedSinceBindsTheVMNoMore": {
			fenceAfter:   testLease,
			others:       map[string]wire.NodeHeartbeat{"node2": roomy(testPool)},
			group:        &v1alpha1.PlacementGroupSpec{Policy: v1alpha1.PlacementAntiAffinity},
			groupGone:    true,
			groupMembers: []string{"node2"},
			after:        time.Second,
			wantNode:     "node2",
			wantEvents:   []event.Reason{ReasonNodeLost, ReasonRestartedElsewhere},
		},
		"AVMWithoutAvailabilityStays": {
			noAvailability: true,
			fenceAfter:     testLease,
			others:         map[string]wire.NodeHeartbeat{"node2": roomy(testPool)},
			after:          time.Hour,
		},
		"ANodeThatNeverConfirmedTheVMsSpecMayNotFenceItsGuest": {
			fenceAfter: testLease,
			observed:   1,
			others:     map[string]wire.NodeHeartbeat{"node2": roomy(testPool)},
			after:      time.Hour,
			wantEvents: []event.Reason{ReasonNotRestarted},
			wantNote:   "node node1 never confirmed the VM's current spec (generation 2; it acted on 1)",
		},
		"ANodeRemovedForGoodHasAnyOfItsVMsRestartedAtOnce": {
			removed:        true,
			noAvailability: true,
			observed:       1,
			others:         map[string]wire.NodeHeartbeat{"node2": roomy(testPool)},
			after:          -time.Minute,
			wantNode:       "node2",
			wantEvents:     []event.Reason{ReasonNodeLost, ReasonRestartedElsewhere},
			wantLost:       "removed for good (its HypervisorNode deleted): the guest there is taken to be gone",
		},
		"ANodeRemovedForGoodKeepsAVMWhoseVolumeIsOnItsOwnStorage": {
			removed:        true,
			noAvailability: true,
			local:          true,
			others:         map[string]wire.NodeHeartbeat{"node2": roomy(testPool)},
			after:          -time.Minute,
			wantEvents:     []event.Reason{ReasonNotRestarted},
			wantNote:       "cannot restart elsewhere: Volume root is on node node1's own storage",
		},
		"AVMMovingLiveIsTheMigrationsToEnd": {
			fenceAfter: testLease,
			migrating:  true,
			others:     map[string]wire.NodeHeartbeat{"node2": roomy(testPool)},
			after:      time.Hour,
			wantNote:   "once its live migration to node node2 is over",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			b := bus.NewFake()
			rec := &fleettest.Recorder{}
			n := wake.NewNotifier(perobject.NewOwner(nil))
			wakeUps := fleettest.WakeUps(t, n)
			e := testExternal(t, b, rec, n)
			f := e.fleet
			e.opts.Placer, e.opts.FencingMargin = placement.New(), testMargin
			for name, hb := range tc.others {
				b.SetNode(bus.NodeEvent{Node: name, Heartbeat: hb})
				require.Eventually(t, func() bool { return f.Node(name).Heartbeat.Backend != "" }, 5*time.Second, time.Millisecond)
			}
			vm := &v1alpha1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web", UID: testUID, Generation: 2, Annotations: map[string]string{
				v1alpha1.AnnotationNode: testNode, v1alpha1.AnnotationSeal: f.Seal(testUID, testNode, ""),
			}}}
			vm.Spec.ForProvider = v1alpha1.VirtualMachineParameters{Vcpu: 1, Memory: resource.MustParse("1Gi"), DiskAttachments: []v1alpha1.DiskAttachment{{Name: "root"}}}
			if !tc.noAvailability {
				vm.Spec.ForProvider.Availability = &restart
			}
			if tc.migrating {
				m := Migration{ID: "m1", Target: "node2"}
				vm.Annotations[v1alpha1.AnnotationMigration], vm.Annotations[v1alpha1.AnnotationMigrationSeal] = m.String(), MigrationSeal(f, testUID, m)
			}
			v := vol("root", "")
			v.Annotations = map[string]string{v1alpha1.AnnotationNode: cmp.Or(tc.volumeOn, testNode)}
			v.Annotations[v1alpha1.AnnotationSeal] = f.Seal(string(v.UID), v.Annotations[v1alpha1.AnnotationNode], "")
			if !tc.local {
				v.Spec.ForProvider.StoragePool = testPool
			}
			scheme := runtime.NewScheme()
			require.NoError(t, v1alpha1.SchemeBuilder.AddToScheme(scheme))
			objs := []client.Object{vm, v}
			if tc.group != nil {
				vm.Spec.ForProvider.PlacementGroup = ptr.To(v1alpha1.LocalName("web"))
				if !tc.groupGone {
					objs = append(objs, &v1alpha1.PlacementGroup{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"}, Spec: *tc.group})
				}
				for i, node := range tc.groupMembers {
					uid := fmt.Sprintf("member-%d", i)
					m := &v1alpha1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: uid, UID: types.UID(uid), Annotations: map[string]string{
						v1alpha1.AnnotationNode: node, v1alpha1.AnnotationSeal: f.Seal(uid, node, ""),
					}}}
					m.Spec.ForProvider.PlacementGroup = vm.Spec.ForProvider.PlacementGroup
					objs = append(objs, m)
				}
			}
			if tc.removed {
				objs = append(objs, &v1alpha1.HypervisorNode{ObjectMeta: metav1.ObjectMeta{
					Name: testNode, DeletionTimestamp: &metav1.Time{Time: time.Now()}, Finalizers: []string{"compute.virtfleet.io/hypervisornode"},
				}})
			}
			for name, phase := range tc.snapshots {
				objs = append(objs, &v1alpha1.VirtualMachineSnapshot{
					ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
					Spec:       v1alpha1.VirtualMachineSnapshotSpec{VMName: "web"},
					Status:     v1alpha1.VirtualMachineSnapshotStatus{Phase: phase, SourceUID: testUID, Node: testNode},
				})
			}
			kube := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).
				WithIndex(&v1alpha1.VirtualMachineSnapshot{}, index.SnapshotsOfVM.Index, index.SnapshotsOfVM.Uses).
				WithIndex(&v1alpha1.VirtualMachine{}, index.PlacementGroupMembers.Index, index.PlacementGroupMembers.Uses).Build()
			e.kube, e.reader = kube, kube
			require.NoError(t, kube.Get(t.Context(), client.ObjectKeyFromObject(vm), vm))
			n.Remember(vm)

			// node1 runs the guest, acting on the VM's spec, then is lost.
			bus.SetValue(b, wire.GuestReports, testNode, testUID, wire.Report{
				ProtocolVersion: wire.ProtocolVersion, UID: testUID, Node: testNode, Phase: wire.PhaseRunning, ObservedGeneration: cmp.Or(tc.observed, vm.Generation),
			})
			require.Eventually(t, func() bool { _, ok := f.Guests.Report(testNode, testUID); return ok }, 5*time.Second, time.Millisecond)
			b.SetNode(bus.NodeEvent{Node: testNode, Heartbeat: wire.NodeHeartbeat{Backend: "libvirt", FenceAfterMillis: tc.fenceAfter.Milliseconds()}})
			b.SetNode(bus.NodeEvent{Node: testNode, Lost: true})
			require.Eventually(t, func() bool { return f.Node(testNode).Lost }, 5*time.Second, time.Millisecond)
			e.clock = func() time.Time { return f.Node(testNode).LastSeen.Add(tc.fenceAfter + testMargin + tc.after) }

			moved, err := e.restartElsewhere(t.Context(), vm)
			require.NoError(t, err)
			// A second reconcile records no event again.
			if !moved {
				_, err = e.restartElsewhere(t.Context(), vm)
				require.NoError(t, err)
			}

			want := cmp.Or(tc.wantNode, testNode)
			assert.Equal(t, tc.wantNode != "", moved, "moved")
			got := &v1alpha1.VirtualMachine{}
			require.NoError(t, kube.Get(t.Context(), client.ObjectKeyFromObject(vm), got))
			assert.Equal(t, want, got.Annotations[v1alpha1.AnnotationNode], "the VM's node")
			assert.True(t, f.Sealed(got), "the VM's node is the hub's own placement")
			gotVol := &v1alpha1.Volume{}
			require.NoError(t, kube.Get(t.Context(), client.ObjectKeyFromObject(v), gotVol))
			assert.Equal(t, cmp.Or(tc.wantNode, cmp.Or(tc.volumeOn, testNode)), gotVol.Annotations[v1alpha1.AnnotationNode], "the Volume's node")
			assert.True(t, f.Sealed(gotVol), "the Volume's node is the hub's own binding")
			if tc.wantNode != "" {
				assert.Equal(t, []string{testNode}, Leftovers(got), "the lost node's intent is deleted and its late reports are not foreign")
				from, at, ok := strings.Cut(got.Annotations[v1alpha1.AnnotationRestartedFrom], "@")
				assert.True(t, ok && from == testNode, "restarted-from names the lost node: %q", got.Annotations[v1alpha1.AnnotationRestartedFrom])
				_, perr := time.Parse(time.RFC3339, at)
				assert.NoError(t, perr, "restarted-from says when")
			} else {
				assert.Empty(t, Leftovers(got))
				assert.NotContains(t, got.Annotations, v1alpha1.AnnotationRestartedFrom)
			}

			var reasons []event.Reason
			for _, ev := range rec.Events() {
				reasons = append(reasons, ev.Reason)
			}
			assert.Equal(t, tc.wantEvents, reasons)
			if tc.wantNode != "" {
				evs := rec.Events()
				assert.Equal(t, event.TypeWarning, evs[0].Type)
				if tc.wantLost != "" {
					assert.Contains(t, evs[0].Message, tc.wantLost)
				} else {
					assert.Contains(t, evs[0].Message, "its lease of 20s ran out at ")
					assert.Contains(t, evs[0].Message, ": the guest there is fenced")
				}
				assert.Equal(t, event.TypeNormal, evs[1].Type)
				assert.Equal(t, "restarted on node "+tc.wantNode, evs[1].Message)
				if len(evs) > 2 {
					assert.Equal(t, event.TypeWarning, evs[2].Type)
					assert.Contains(t, evs[2].Message, tc.wantNote)
				}
			}

			if tc.wantNode == "" {
				e.setConditions(vm, v1alpha1.VirtualMachineObservation{Phase: v1alpha1.PhaseUnknown}, testNode, f.Node(testNode))
				assert.Contains(t, vm.GetCondition(TypeNodeLost).Message, cmp.Or(tc.wantNote, "the VM is not started elsewhere"))
			}
			fleettest.AssertWakeUp(t, wakeUps, tc.wantWakeUp, types.NamespacedName{Namespace: "default", Name: "web"})
		})
	}
}

// The placement loop, and a restart elsewhere, place a VM only on nodes
// reaching every shared pool of its Volumes.
func TestRequestNamesTheSharedPools(t *testing.T) {
	on := func(name, pool string) v1alpha1.Volume {
		v := vol(name, "")
		v.Spec.ForProvider.StoragePool = pool
		return *v
	}
	req, err := request(vm(), dependencies{volumes: []v1alpha1.Volume{on("root", "slow"), on("data", ""), on("logs", "fast"), on("tmp", "slow")}}, nil)
	require.NoError(t, err)
	assert.Equal(t, []string{"fast", "slow"}, req.Pools)

	req, err = request(vm(), dependencies{volumes: []v1alpha1.Volume{on("root", "")}}, nil)
	require.NoError(t, err)
	assert.Empty(t, req.Pools, "a VM on its node's own storage needs no shared pool")
}
