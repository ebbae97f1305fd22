package virtualmachine

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/crossplane/crossplane-runtime/v2/pkg/event"
	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/apiwrites"
	"github.com/virtfleet/virtfleet/hub/internal/bus"
	"github.com/virtfleet/virtfleet/hub/internal/fleet"
	"github.com/virtfleet/virtfleet/hub/internal/fleet/fleettest"
	"github.com/virtfleet/virtfleet/hub/internal/perobject"
	"github.com/virtfleet/virtfleet/hub/internal/tenancy"
	"github.com/virtfleet/virtfleet/hub/internal/wake"
	"github.com/virtfleet/virtfleet/internal/harness/controlplane"
)

const (
	testNode    = "node1"
	testUID     = "uid-a"
	testFencing = 10 * time.Second
)

// testExternal returns the VM controller's client over a fleet of the fake bus
// b, recording its events in rec.
func testExternal(t *testing.T, b *bus.Fake, rec event.Recorder, n *wake.Notifier) *external {
	t.Helper()
	c := &connector{log: logging.NewNopLogger(), opts: Options{FencingTimeout: testFencing, Notifier: n}, recorder: rec, state: newState(perobject.NewOwner(nil))}
	return &external{connector: c, fleet: fleettest.Start(t, b), grant: trusted}
}

// trusted is the grant of a namespace that may import and choose nodes:
// tests that place VMs by writing the node annotation themselves, not
// through the placement loop, run as such a namespace. TestAdmit pins what
// a namespace without it may do.
var trusted = tenancy.Grant{Import: true, ChooseNode: true}

// report makes node report the guest testUID with message, and waits for
// the fleet to hold it.
func report(t *testing.T, b *bus.Fake, f *fleet.Fleet, message string) {
	t.Helper()
	bus.SetValue(b, wire.GuestReports, testNode, testUID, wire.Report{
		ProtocolVersion: wire.ProtocolVersion, UID: testUID, Node: testNode, Phase: wire.PhaseFailed, Message: message,
	})
	require.Eventually(t, func() bool { _, ok := f.Guests.Report(testNode, testUID); return ok }, 5*time.Second, time.Millisecond)
}

// setNode plays the node's heartbeat, lost or not, and waits for the fleet
// to see it.
func setNode(t *testing.T, b *bus.Fake, f *fleet.Fleet, lost bool) {
	t.Helper()
	b.SetNode(bus.NodeEvent{Node: testNode, Heartbeat: wire.NodeHeartbeat{Backend: "libvirt"}})
	if lost {
		b.SetNode(bus.NodeEvent{Node: testNode, Lost: true})
	}
	require.Eventually(t, func() bool { return f.Node(testNode).Lost == lost }, 5*time.Second, time.Millisecond)
}

// condition is vm's condition of type ct, without its transition time.
func condition(vm *v1alpha1.VirtualMachine, ct xpv2.ConditionType) xpv2.Condition {
	c := vm.GetCondition(ct)
	c.LastTransitionTime = metav1.Time{}
	return c
}

func TestSetConditions(t *testing.T) {
	lostSince := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	upToDate := xpv2.Condition{Type: TypeRestartRequired, Status: corev1.ConditionFalse, Reason: "UpToDate"}
	heartbeatFresh := xpv2.Condition{Type: TypeNodeLost, Status: corev1.ConditionFalse, Reason: "HeartbeatFresh"}
	cases := map[string]struct {
		obs         v1alpha1.VirtualMachineObservation
		node        fleet.NodeStatus
		message     string
		annotations map[string]string

		wantReady           xpv2.Condition
		wantRestartRequired xpv2.Condition
		wantNodeLost        xpv2.Condition
	}{
		"ARunningVMIsReady": {
			obs:                 v1alpha1.VirtualMachineObservation{Phase: v1alpha1.PhaseRunning},
			wantReady:           xpv2.Condition{Type: xpv2.TypeReady, Status: corev1.ConditionTrue, Reason: xpv2.ReasonAvailable},
			wantRestartRequired: upToDate,
			wantNodeLost:        heartbeatFresh,
		},
		"ARunningVMIsReadyWithWhatItsNodeCouldNotApplyLive": {
			obs:                 v1alpha1.VirtualMachineObservation{Phase: v1alpha1.PhaseRunning},
			message:             "cannot grow disk default_root to 1099511627776 bytes: storage pool default has 1073741824 bytes free, the disk needs 1098437885952 more",
			wantReady:           xpv2.Condition{Type: xpv2.TypeReady, Status: corev1.ConditionTrue, Reason: xpv2.ReasonAvailable, Message: "cannot grow disk default_root to 1099511627776 bytes: storage pool default has 1073741824 bytes free, the disk needs 1098437885952 more"},
			wantRestartRequired: upToDate,
			wantNodeLost:        heartbeatFresh,
		},
		"AVMNotRunningIsNotReadyWithItsPhaseAsReasonAndTheNodesMessage": {
			obs:                 v1alpha1.VirtualMachineObservation{Phase: v1alpha1.PhaseFailed},
			message:             "cannot import image ubuntu: 404",
			wantReady:           xpv2.Condition{Type: xpv2.TypeReady, Status: corev1.ConditionFalse, Reason: "Failed", Message: "cannot import image ubuntu: 404"},
			wantRestartRequired: upToDate,
			wantNodeLost:        heartbeatFresh,
		},
		"ASpecChangedWhileRunningRequiresARestartAndSaysHow": {
			obs:       v1alpha1.VirtualMachineObservation{Phase: v1alpha1.PhaseRunning, RestartRequired: true},
			wantReady: xpv2.Condition{Type: xpv2.TypeReady, Status: corev1.ConditionTrue, Reason: xpv2.ReasonAvailable},
			wantRestartRequired: xpv2.Condition{Type: TypeRestartRequired, Status: corev1.ConditionTrue, Reason: "SpecChanged",
				Message: "the spec changed while the VM runs; the change applies at the next start (restart it with the compute.virtfleet.io/restart-requested-at annotation)"},
			wantNodeLost: heartbeatFresh,
		},
		"ARestartRequiredNamesWhatWaitsAsTheNodeSaysIt": {
			obs:       v1alpha1.VirtualMachineObservation{Phase: v1alpha1.PhaseRunning, RestartRequired: true},
			message:   "disk default_data is still attached to the running guest, which has not released it since it was detached; it is gone at the next start",
			wantReady: xpv2.Condition{Type: xpv2.TypeReady, Status: corev1.ConditionTrue, Reason: xpv2.ReasonAvailable, Message: "disk default_data is still attached to the running guest, which has not released it since it was detached; it is gone at the next start"},
			wantRestartRequired: xpv2.Condition{Type: TypeRestartRequired, Status: corev1.ConditionTrue, Reason: "SpecChanged",
				Message: "the spec changed while the VM runs; the change applies at the next start (restart it with the compute.virtfleet.io/restart-requested-at annotation): disk default_data is still attached to the running guest, which has not released it since it was detached; it is gone at the next start"},
			wantNodeLost: heartbeatFresh,
		},
		"APausedVMIsNotReadyAndSaysHowToResumeIt": {
			obs:                 v1alpha1.VirtualMachineObservation{Phase: v1alpha1.PhasePaused},
			annotations:         map[string]string{v1alpha1.AnnotationPaused: "true"},
			wantReady:           xpv2.Condition{Type: xpv2.TypeReady, Status: corev1.ConditionFalse, Reason: "Paused", Message: "the guest is paused, as the compute.virtfleet.io/paused annotation asks; remove the annotation to resume it"},
			wantRestartRequired: upToDate,
			wantNodeLost:        heartbeatFresh,
		},
		"AGuestPausedWithoutTheAnnotationIsNotReadyWithTheNodesMessage": {
			obs:                 v1alpha1.VirtualMachineObservation{Phase: v1alpha1.PhasePaused},
			message:             "resuming the guest",
			wantReady:           xpv2.Condition{Type: xpv2.TypeReady, Status: corev1.ConditionFalse, Reason: "Paused", Message: "resuming the guest"},
			wantRestartRequired: upToDate,
			wantNodeLost:        heartbeatFresh,
		},
		"ALostNodeMakesTheVMUnknownNodeLostAndNotStartedElsewhere": {
			obs:                 v1alpha1.VirtualMachineObservation{Phase: v1alpha1.PhaseUnknown},
			node:                fleet.NodeStatus{Lost: true, LostSince: lostSince},
			wantReady:           xpv2.Condition{Type: xpv2.TypeReady, Status: corev1.ConditionFalse, Reason: "Unknown"},
			wantRestartRequired: upToDate,
			wantNodeLost: xpv2.Condition{Type: TypeNodeLost, Status: corev1.ConditionTrue, Reason: "HeartbeatExpired",
				Message: "node node1 has sent no heartbeat since 2026-11-23T12:00:00Z; the VM is not started elsewhere"},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			b := bus.NewFake()
			e := testExternal(t, b, &fleettest.Recorder{}, wake.NewNotifier(perobject.NewOwner(nil)))
			if tc.message != "" {
				report(t, b, e.fleet, tc.message)
			}
			vm := &v1alpha1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "a", UID: testUID, Annotations: tc.annotations}}

			e.setConditions(vm, tc.obs, testNode, tc.node)

			assert.Equal(t, tc.wantReady, condition(vm, xpv2.TypeReady))
			assert.Equal(t, tc.wantRestartRequired, condition(vm, TypeRestartRequired))
			assert.Equal(t, tc.wantNodeLost, condition(vm, TypeNodeLost))
		})
	}
}

func TestRecordTransition(t *testing.T) {
	at := func(p v1alpha1.Phase) v1alpha1.VirtualMachineObservation {
		return v1alpha1.VirtualMachineObservation{Phase: p, Node: testNode}
	}
	restartRequired := at(v1alpha1.PhaseRunning)
	restartRequired.RestartRequired = true
	cases := map[string]struct {
		before, after v1alpha1.VirtualMachineObservation
		message       string
		want          []event.Event
	}{
		"StartedWhenItRuns": {
			before: at(v1alpha1.PhaseStarting), after: at(v1alpha1.PhaseRunning),
			want: []event.Event{{Type: event.TypeNormal, Reason: ReasonStarted, Message: "Running on node node1"}},
		},
		"StoppedWhenItStops": {
			before: at(v1alpha1.PhaseStopping), after: at(v1alpha1.PhaseStopped),
			want: []event.Event{{Type: event.TypeNormal, Reason: ReasonStopped, Message: "Stopped on node node1"}},
		},
		"AWarningWithTheNodesMessageWhenItFails": {
			before: at(v1alpha1.PhaseProvisioning), after: at(v1alpha1.PhaseFailed), message: "cannot import image ubuntu: 404",
			want: []event.Event{{Type: event.TypeWarning, Reason: ReasonFailed, Message: "cannot import image ubuntu: 404"}},
		},
		"AWarningWhenItsNodeIsLost": {
			before: at(v1alpha1.PhaseRunning), after: at(v1alpha1.PhaseUnknown),
			want: []event.Event{{Type: event.TypeWarning, Reason: ReasonNodeLost, Message: "node node1 sends no heartbeat; the VM's state is unknown"}},
		},
		"PausedWhenItPauses": {
			before: at(v1alpha1.PhaseRunning), after: at(v1alpha1.PhasePaused),
			want: []event.Event{{Type: event.TypeNormal, Reason: ReasonPaused, Message: "Paused on node node1"}},
		},
		"ResumedNotStartedWhenItRunsAgainAfterAPause": {
			before: at(v1alpha1.PhasePaused), after: at(v1alpha1.PhaseRunning),
			want: []event.Event{{Type: event.TypeNormal, Reason: ReasonResumed, Message: "Resumed on node node1"}},
		},
		"NothingWhileThePhaseStays": {
			before: at(v1alpha1.PhaseRunning), after: at(v1alpha1.PhaseRunning),
		},
		"NothingForAnIntermediatePhase": {
			before: at(v1alpha1.PhaseScheduled), after: at(v1alpha1.PhaseProvisioning),
		},
		"RestartRequiredOnceWhenItBecomesRequired": {
			before: at(v1alpha1.PhaseRunning), after: restartRequired,
			want: []event.Event{{Type: event.TypeNormal, Reason: ReasonRestartRequired, Message: "The spec changed while the VM runs; the change applies at the next start"}},
		},
		"NoRestartRequiredAgainWhileItStaysRequired": {
			before: restartRequired, after: restartRequired,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			b := bus.NewFake()
			rec := &fleettest.Recorder{}
			e := testExternal(t, b, rec, wake.NewNotifier(perobject.NewOwner(nil)))
			if tc.message != "" {
				report(t, b, e.fleet, tc.message)
			}
			vm := &v1alpha1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "a", UID: testUID}}

			e.recordTransition(vm, tc.before, tc.after, testNode)

			got := rec.Events()
			for i := range got {
				got[i].Annotations = nil
			}
			assert.Equal(t, tc.want, got)
		})
	}
}

// TestObserveDeletion pins the fencing decisions: a deleted VM exists until
// its node confirms the guest is gone, or, when the node is lost, until the
// fencing timeout has passed, and never longer.
func TestObserveDeletion(t *testing.T) {
	cases := map[string]struct {
		node string
		lost bool
		// waited is how long ago the VM was deleted.
		waited time.Duration
		// reported is whether the node still reports the guest.
		reported bool
		// intentDeleted is whether this hub deleted the VM's intent.
		intentDeleted bool

		wantExists bool
		wantEvent  event.Reason
		wantWakeUp bool
	}{
		"AVMOnNoNodeIsGoneAtOnce": {
			node: "", wantExists: false,
		},
		"AVMWhoseIntentIsNotDeletedYetExistsSoThatDeleteRuns": {
			node: testNode, wantExists: true,
		},
		"AVMWhoseNodeStillReportsTheGuestExists": {
			node: testNode, reported: true, intentDeleted: true, wantExists: true,
		},
		"AVMWhoseNodeConfirmedTheGuestGoneIsGone": {
			node: testNode, intentDeleted: true, wantExists: false,
		},
		"ALostNodeWithinTheFencingTimeoutHoldsTheVMAndWakesItWhenTheTimeoutIsUp": {
			node: testNode, lost: true, waited: testFencing - 300*time.Millisecond, reported: true, intentDeleted: true,
			wantExists: true, wantWakeUp: true,
		},
		"ALostNodePastTheFencingTimeoutFinalizesTheVMWithAWarning": {
			node: testNode, lost: true, waited: testFencing + time.Second, reported: true, intentDeleted: true,
			wantExists: false, wantEvent: ReasonNodeLost,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			b := bus.NewFake()
			rec := &fleettest.Recorder{}
			n := wake.NewNotifier(perobject.NewOwner(nil))
			wakeUps := fleettest.WakeUps(t, n)
			e := testExternal(t, b, rec, n)
			setNode(t, b, e.fleet, tc.lost)
			if tc.reported {
				report(t, b, e.fleet, "")
			}
			if tc.intentDeleted {
				e.state.deleted.Store(types.UID(testUID), struct{}{})
			}
			deleted := metav1.NewTime(time.Now().Add(-tc.waited))
			vm := &v1alpha1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "a", UID: testUID, DeletionTimestamp: &deleted}}
			n.Remember(vm)

			obs := e.observeDeletion(vm, tc.node)

			assert.Equal(t, tc.wantExists, obs.ResourceExists, "exists")
			if tc.node != "" {
				assert.Equal(t, v1alpha1.PhaseDeleting, vm.Status.AtProvider.Phase)
				assert.Equal(t, xpv2.Deleting().Reason, vm.GetCondition(xpv2.TypeReady).Reason)
			}
			for _, ev := range rec.AssertWarning(t, tc.wantEvent) {
				assert.Contains(t, ev.Message, "fencing timeout")
			}
			fleettest.AssertWakeUp(t, wakeUps, tc.wantWakeUp, types.NamespacedName{Namespace: "default", Name: "a"})
		})
	}
}

// TestABusWriteThatFailedIsRetriedOnceTheServerIsBack: publishing and
// deleting an intent while the NATS server is away fail, and the VM is
// reconciled again as soon as the fleet's watch has caught up with the
// server, not when the reconcile's backoff expires.
func TestABusWriteThatFailedIsRetriedOnceTheServerIsBack(t *testing.T) {
	cases := map[string]func(e *external, vm *v1alpha1.VirtualMachine) error{
		"Publish": func(e *external, vm *v1alpha1.VirtualMachine) error {
			return e.publish(context.Background(), vm, dependencies{}, testNode)
		},
		"Delete": func(e *external, vm *v1alpha1.VirtualMachine) error {
			_, err := e.Delete(context.Background(), vm)
			return err
		},
	}
	for name, write := range cases {
		t.Run(name, func(t *testing.T) {
			b := bus.NewFake()
			n := wake.NewNotifier(perobject.NewOwner(nil))
			wakeUps := fleettest.WakeUps(t, n)
			e := testExternal(t, b, event.NewNopRecorder(), n)
			vm := &v1alpha1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{
				Namespace: "default", Name: "web", UID: testUID, Annotations: map[string]string{v1alpha1.AnnotationNode: testNode},
			}}
			n.Remember(vm)

			b.SetDown(errors.New("nats: connection closed"))
			require.ErrorContains(t, write(e, vm), "nats: connection closed")
			select {
			case req := <-wakeUps:
				t.Fatalf("woken while the server is away: %v", req)
			default:
			}

			b.SetDown(nil)
			select {
			case req := <-wakeUps:
				assert.Equal(t, "web", req.Name)
			case <-time.After(5 * time.Second):
				t.Fatal("not woken once the server is back")
			}
		})
	}
}

// TestTheStatusOfAVMJustPublishedWaitsForItsReport: the Scheduled status
// the reconcile that published the intent ends with is not written, whether
// the node's report came after Observe (nodes answer within milliseconds)
// or not at all yet; the reconcile the report queues writes what it says.
func TestTheStatusOfAVMJustPublishedWaitsForItsReport(t *testing.T) {
	for name, reportedMeanwhile := range map[string]bool{"NoReportYet": false, "ReportedAfterObserve": true} {
		t.Run(name, func(t *testing.T) {
			vm := &v1alpha1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{
				Namespace: "default", Name: "web", UID: testUID, Annotations: map[string]string{v1alpha1.AnnotationNode: testNode},
			}}
			s := runtime.NewScheme()
			require.NoError(t, v1alpha1.AddToScheme(s))
			stored := fake.NewClientBuilder().WithScheme(s).WithObjects(vm).WithStatusSubresource(vm).Build()
			b := bus.NewFake()
			e := testExternal(t, b, event.NewNopRecorder(), wake.NewNotifier(perobject.NewOwner(nil)))
			e.holder = apiwrites.NewClient(stored, stored, perobject.NewOwner(nil))
			e.kube = e.holder

			require.NoError(t, stored.Get(context.Background(), client.ObjectKeyFromObject(vm), vm))
			vm.Status.AtProvider = v1alpha1.VirtualMachineObservation{Phase: v1alpha1.PhaseScheduled, Node: testNode}
			vm.SetConditions(xpv2.ReconcileSuccess())
			if reportedMeanwhile {
				report(t, b, e.fleet, "")
			}
			_, err := e.Update(context.Background(), vm)
			require.NoError(t, err)
			_, published := bus.Stored(b, wire.GuestIntents, testNode, testUID)
			require.True(t, published)

			require.NoError(t, e.holder.Status().Update(context.Background(), vm))
			got := &v1alpha1.VirtualMachine{}
			require.NoError(t, stored.Get(context.Background(), client.ObjectKeyFromObject(vm), got))
			assert.Empty(t, got.Status.AtProvider.Phase, "the Scheduled status was written")
		})
	}
}

// TestBindingAVolumeWhoseCachedCopyIsOutOfDate: the hub binds a Volume as
// its cache shows it, and the Volume's own controller may have written its
// status since. The binding is made all the same, against a real API
// server; a Volume another VM bound meanwhile is not taken over.
func TestBindingAVolumeWhoseCachedCopyIsOutOfDate(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a kube-apiserver; skipped with -short")
	}
	cp := controlplane.StartForTest(t)
	ctx := context.Background()
	e := &external{connector: &connector{kube: cp.Client, reader: cp.Client}, fleet: fleettest.Start(t, bus.NewFake())}

	cases := map[string]struct {
		// meanwhile is what happened to the Volume after the cache read it.
		meanwhile func(v *v1alpha1.Volume)
		wantNode  string
		wantErr   string
	}{
		"ItsStatusWasWritten": {
			meanwhile: func(v *v1alpha1.Volume) {
				v.Status.AtProvider.Phase = v1alpha1.PhasePending
				require.NoError(t, cp.Client.Status().Update(ctx, v))
			},
			wantNode: testNode,
		},
		"AnotherVMBoundItElsewhere": {
			meanwhile: func(v *v1alpha1.Volume) {
				meta.AddAnnotations(v, map[string]string{v1alpha1.AnnotationNode: "other"})
				require.NoError(t, cp.Client.Update(ctx, v))
			},
			wantNode: "other",
			wantErr:  "Volume anothervmbounditelsewhere was bound to node other meanwhile",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			v := vol(strings.ToLower(name), "")
			v.UID = ""
			require.NoError(t, cp.Client.Create(ctx, v))
			cached := v.DeepCopy()
			tc.meanwhile(v.DeepCopy())

			err := e.bindVolumes(ctx, &v1alpha1.VirtualMachine{}, dependencies{volumes: []v1alpha1.Volume{*cached}}, testNode)
			if tc.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.wantErr)
			} else {
				require.NoError(t, err)
			}
			got := &v1alpha1.Volume{}
			require.NoError(t, cp.Client.Get(ctx, client.ObjectKeyFromObject(v), got))
			assert.Equal(t, tc.wantNode, got.GetAnnotations()[v1alpha1.AnnotationNode])
		})
	}
}

// A Volume added to a placed VM's diskAttachments is attached only when
// it is on the VM's node (or on no node yet, when the VM's node takes it):
// one another node holds is refused, named, and nothing is published, so
// the guest runs on with the disks it has.
func TestAVolumeOfAnotherNodeIsNeverAttached(t *testing.T) {
	cases := map[string]struct {
		volumes []*v1alpha1.Volume
		wantErr string
	}{
		"AVolumeOfAnotherNodeNextToSharedOnes": {
			volumes: []*v1alpha1.Volume{vol("root", ""), vol("data", "node2")},
			wantErr: "Volume data is on node node2 and the VM runs on node node1: a VM attaches only volumes of its own node; remove it from spec.forProvider.diskAttachments, or delete and re-create the VM to place it on node node2",
		},
		"AVolumeOfAnotherNodeNextToOnesOfItsOwn": {
			volumes: []*v1alpha1.Volume{vol("root", testNode), vol("data", "node2")},
			wantErr: "volumes root (on node1) and data (on node2) live on different nodes; a VM can only use volumes of one node",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			b := bus.NewFake()
			e := testExternal(t, b, event.NewNopRecorder(), wake.NewNotifier(perobject.NewOwner(nil)))
			vm := &v1alpha1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "vm", UID: testUID}}
			var d dependencies
			for _, v := range tc.volumes {
				d.volumes = append(d.volumes, *v)
			}
			err := e.ensure(context.Background(), vm, d, testNode)
			require.Error(t, err)
			assert.Equal(t, tc.wantErr, err.Error())
			assert.Zero(t, b.Puts(), "nothing published")
		})
	}
}
