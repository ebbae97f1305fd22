package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/harness/diskimagetest"
	"github.com/virtfleet/virtfleet/internal/harness/natstest"
	"github.com/virtfleet/virtfleet/internal/harness/stack"
)

// The nodes of TestANodeSpeaksOnlyForItself are named as Kubernetes often
// names them, with dots a NATS token cannot hold (wire.NodeToken).
const (
	node1 = "node-1.rack-a.example.com"
	node2 = "node-2.rack-b.example.com"
)

// TestANodeSpeaksOnlyForItself plays a hostile node: with node1's real
// agent credentials it writes what NATS lets it write — reports under its
// own keys — about a VM, its Volume and its image that are all on node2.
// What the API shows of them does not change, the VM's and the Volume's
// deletions are neither hastened nor blocked, and the hub counts the
// attempts in its metric and shows them as Warning events naming node1.
// Both nodes have dotted names, and kubectl shows them as they are.
func TestANodeSpeaksOnlyForItself(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the whole stack; skipped with -short")
	}
	t.Parallel()
	start := time.Now()
	h := startStack(t, "vf-trust-", stack.Options{Nodes: []string{node1, node2}, FencingTimeout: 5 * time.Minute})
	ctx := context.Background()

	data := diskimagetest.QCOW2(1 << 20)
	sum := sha256.Sum256(data)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.ServeContent(w, r, "ubuntu.qcow2", time.Time{}, bytes.NewReader(data))
	}))
	defer srv.Close()
	h.create(t, &v1alpha1.DiskImage{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "ubuntu"},
		Spec: v1alpha1.DiskImageSpec{ForProvider: v1alpha1.DiskImageParameters{
			Source: v1alpha1.DiskImageSource{URL: srv.URL + "/ubuntu.qcow2", SHA256: hex.EncodeToString(sum[:])},
		}},
	})
	h.create(t, imageVolume("victim-disk", "ubuntu"))
	victim := imageVM("victim", "victim-disk")
	victim.Spec.ForProvider.NodeSelector = map[string]string{"kubernetes.io/hostname": node2}
	h.create(t, victim)

	vm := h.wait(t, "victim", 60*time.Second, running)
	require.Equal(t, node2, vm.Status.AtProvider.Node)
	k := kubectl{t: t, path: h.s.ControlPlane.Kubectl, kubeconfig: h.s.ControlPlane.Kubeconfig}
	assert.Regexp(t, `(?m)^victim\s+Running\s+0\s+\S+\s+`+regexp.QuoteMeta(node2)+`\s`, k.run("get", "vm", "victim", "-o", "wide"),
		"NODE shows the node's real name")
	img := h.waitImage(t, "ubuntu", 30*time.Second, func(img *v1alpha1.DiskImage) bool {
		return img.Status.AtProvider.Phase == v1alpha1.ImagePhaseReady
	})
	require.Equal(t, []string{node2}, img.Status.AtProvider.Nodes)
	vol := &v1alpha1.Volume{}
	require.NoError(t, h.kube.Get(ctx, types.NamespacedName{Namespace: ns, Name: "victim-disk"}, vol))
	t.Logf("stack up and the victim running on node2 after %s", time.Since(start))

	evil := hostileNode(t, h, node1)
	vmUID, volUID, imgUID := string(vm.UID), string(vol.UID), string(img.UID)
	spoofVM := func(phase wire.Phase) {
		spoof(t, evil, wire.GuestReports, vmUID, wire.Report{
			ProtocolVersion: wire.ProtocolVersion, UID: vmUID, Node: node1, Phase: phase, ID: vmUID,
			Message: "spoofed by node1", ObservedAt: time.Now(),
			Interfaces: []wire.Interface{{Network: "net-db", MAC: "52:54:00:66:66:66", IPs: []string{"6.6.6.6"}, Source: wire.AddressSourceLease}},
		})
	}
	spoofVolume := func(gone bool, msg string) {
		spoof(t, evil, wire.VolumeReports, volUID, wire.VolumeReport{
			ProtocolVersion: wire.ProtocolVersion, UID: volUID, Gone: gone, Message: msg, ObservedAt: time.Now(),
		})
	}
	unchanged := func(t *testing.T) {
		t.Helper()
		now := h.get(t, "victim")
		assert.Equal(t, vm.Status.AtProvider.Phase, now.Status.AtProvider.Phase)
		assert.Equal(t, node2, now.Status.AtProvider.Node)
		assert.Equal(t, vm.Status.AtProvider.IP, now.Status.AtProvider.IP)
		assert.NotContains(t, now.GetCondition("Ready").Message, "spoofed")
		i := &v1alpha1.DiskImage{}
		require.NoError(t, h.kube.Get(ctx, types.NamespacedName{Namespace: ns, Name: "ubuntu"}, i))
		assert.Equal(t, v1alpha1.ImagePhaseReady, i.Status.AtProvider.Phase)
		assert.Equal(t, []string{node2}, i.Status.AtProvider.Nodes)
		assert.NotContains(t, i.Status.AtProvider.Message, "spoofed")
	}

	t.Run("SpoofedReportsChangeNothingAUserSeesAndAreFlagged", func(t *testing.T) {
		spoofVM(wire.PhaseFailed)
		spoofVolume(true, "")
		spoof(t, evil, wire.ImageReports, imgUID, wire.ImageReport{
			ProtocolVersion: wire.ProtocolVersion, UID: imgUID, Node: node1, Phase: wire.ImagePhaseFailed, Message: "spoofed by node1",
		})
		require.Eventually(t, func() bool {
			return foreignReports(t, h, "VirtualMachine", "put") >= 1 && foreignReports(t, h, "DiskImage", "put") >= 1
		}, 30*time.Second, 100*time.Millisecond, "the hub counts node1's reports about node2's VM and image")
		h.assertEvent(t, "victim", "ForeignReport", "node "+node1+" sent a report of this VirtualMachine, which is placed on node "+node2)
		assertEventOn(t, h, "DiskImage", "ubuntu", "ForeignReport", "node "+node1+" sent a report of this DiskImage")
		unchanged(t)
	})

	t.Run("SpoofedDeletesChangeNothingAUserSees", func(t *testing.T) {
		evil.delete(t, wire.GuestReports.Key, vmUID)
		evil.delete(t, wire.ImageReports.Key, imgUID)
		require.Eventually(t, func() bool {
			return foreignReports(t, h, "VirtualMachine", "delete") >= 1 && foreignReports(t, h, "DiskImage", "delete") >= 1
		}, 30*time.Second, 100*time.Millisecond, "the hub counts node1's deletes")
		h.assertEvent(t, "victim", "ForeignReport", "node "+node1+" deleted its report of this VirtualMachine")
		unchanged(t)
	})

	t.Run("TheVMsDeletionIsNeitherHastenedNorBlocked", func(t *testing.T) {
		spoofVM(wire.PhaseRunning)
		require.NoError(t, h.s.StopAgent(node2))
		require.NoError(t, h.kube.Delete(ctx, h.get(t, "victim")))
		// node1 says the guest is gone: the VM must wait for node2 all the same.
		evil.delete(t, wire.GuestReports.Key, vmUID)
		// The window in which a hastened deletion would show.
		assert.Never(t, func() bool {
			return kerrors.IsNotFound(h.kube.Get(ctx, types.NamespacedName{Namespace: ns, Name: "victim"}, &v1alpha1.VirtualMachine{}))
		}, 3*time.Second, 100*time.Millisecond, "node1's word hastened the VM's deletion")
		assert.Equal(t, v1alpha1.PhaseDeleting, h.get(t, "victim").Status.AtProvider.Phase, "the VM waits for its own node")
		// node1 says the guest is still there: node2's word ends it.
		spoofVM(wire.PhaseRunning)
		require.NoError(t, h.s.StartAgent(node2))
		require.Eventually(t, func() bool {
			return kerrors.IsNotFound(h.kube.Get(ctx, types.NamespacedName{Namespace: ns, Name: "victim"}, &v1alpha1.VirtualMachine{}))
		}, 30*time.Second, 100*time.Millisecond, "node2 confirms the deletion; node1's report does not hold it up")
	})

	t.Run("TheVolumesDeletionIsNeitherHastenedNorBlocked", func(t *testing.T) {
		require.NoError(t, h.s.StopAgent(node2))
		require.NoError(t, h.kube.Delete(ctx, vol))
		spoofVolume(true, "") // "gone": would hasten
		assert.Never(t, func() bool {
			return kerrors.IsNotFound(h.kube.Get(ctx, types.NamespacedName{Namespace: ns, Name: "victim-disk"}, &v1alpha1.Volume{}))
		}, 3*time.Second, 100*time.Millisecond, "node1's word hastened the Volume's deletion")
		require.NoError(t, h.kube.Get(ctx, types.NamespacedName{Namespace: ns, Name: "victim-disk"}, &v1alpha1.Volume{}), "the Volume waits for its own node")
		spoofVolume(false, "spoofed by node1: still attached") // would block
		require.NoError(t, h.s.StartAgent(node2))
		require.Eventually(t, func() bool {
			return kerrors.IsNotFound(h.kube.Get(ctx, types.NamespacedName{Namespace: ns, Name: "victim-disk"}, &v1alpha1.Volume{}))
		}, 30*time.Second, 100*time.Millisecond, "node2 confirms the volume is gone; node1's report does not hold it up")
		assert.GreaterOrEqual(t, foreignReports(t, h, "Volume", "put"), 1.0)
		assertEventOn(t, h, "Volume", "victim-disk", "ForeignReport", "node "+node1+" sent a report of this Volume, which is placed on node "+node2)
	})
	t.Logf("whole test %s", time.Since(start))
}

// hostile writes reports with a node's own agent credentials, through the
// subjects its NATS permissions allow, as a compromised agent would.
type hostile struct {
	node string
	js   jetstream.JetStream
}

func hostileNode(t *testing.T, h *hub, node string) *hostile {
	t.Helper()
	nc, _ := natstest.Connect(t, h.s.NATS, h.s.AgentIdentities[node])
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	return &hostile{node: node, js: js}
}

// spoof puts v under node's own report key of uid.
func spoof[V any](t *testing.T, e *hostile, k wire.Kind[V], uid string, v V) {
	t.Helper()
	key, err := k.Key(e.node, uid)
	require.NoError(t, err)
	b, err := k.Encode(v)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = e.js.Publish(ctx, wire.Subject(wire.BucketReports, key), b)
	require.NoError(t, err, "a node may write its own report keys")
}

func (e *hostile) delete(t *testing.T, keyOf func(node, uid string) (string, error), uid string) {
	t.Helper()
	key, err := keyOf(e.node, uid)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = e.js.PublishMsg(ctx, &nats.Msg{Subject: wire.Subject(wire.BucketReports, key), Header: nats.Header{"KV-Operation": []string{"DEL"}}})
	require.NoError(t, err)
}

// foreignReports reads the hub's count of node1's foreign reports of kind.
func foreignReports(t *testing.T, h *hub, kind, op string) float64 {
	t.Helper()
	return scrape(t, h.s.HubMetricsURL()).value("virtfleet_hub_foreign_reports_total", "kind", kind, "node", node1, "operation", op)
}

// assertEventOn waits for hasEventOn: the hub's recorder sends events
// after the log line or status change a test saw first.
func assertEventOn(t *testing.T, h *hub, kind, name, reason, text string) {
	t.Helper()
	assert.Eventually(t, func() bool { return hasEventOn(t, h, kind, name, reason, text) }, 30*time.Second, 100*time.Millisecond,
		"an event %s on %s %s saying %q", reason, kind, name, text)
}

// hasEventOn is hub.hasEvent for any kind of object, a condition run on
// Eventually's goroutine: a failed List is logged and looked at again.
func hasEventOn(t *testing.T, h *hub, kind, name, reason, text string) bool {
	t.Helper()
	l := &corev1.EventList{}
	if err := h.kube.List(context.Background(), l, client.InNamespace(ns)); err != nil {
		t.Logf("cannot list events: %v", err)
		return false
	}
	for _, e := range l.Items {
		if e.InvolvedObject.Kind == kind && e.InvolvedObject.Name == name && e.Reason == reason && strings.Contains(e.Message, text) {
			return true
		}
	}
	return false
}
