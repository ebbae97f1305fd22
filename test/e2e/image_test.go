package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/harness/diskimagetest"
	"github.com/virtfleet/virtfleet/internal/harness/libvirttest"
	"github.com/virtfleet/virtfleet/internal/harness/natstest"
	"github.com/virtfleet/virtfleet/internal/harness/stack"
	"github.com/virtfleet/virtfleet/internal/natswire"
)

// TestDiskImages runs the whole system on one node and boots VMs from
// Volumes made from a DiskImage served by a local HTTP server.
func TestDiskImages(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the whole stack; skipped with -short")
	}
	t.Parallel()
	// Images are pruned within a second of their pruneAfter, so that the
	// test sees an image leave the node once its last Volume went.
	h := startStack(t, "vf-img-", stack.Options{Nodes: []string{"node1"}, ImagePruneInterval: time.Second})
	ctx := context.Background()

	// A generated 8 MiB "image"; the download is held until released, so the
	// import can be watched in progress.
	data := diskimagetest.QCOW2(8 << 20)
	sum := sha256.Sum256(data)
	var requests atomic.Int32
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		<-release
		http.ServeContent(w, r, "ubuntu.qcow2", time.Time{}, bytes.NewReader(data))
	}))
	defer srv.Close()
	defer func() {
		select {
		case <-release:
		default:
			close(release)
		}
	}()

	for _, name := range []string{"boot-a", "boot-b"} {
		h.create(t, imageVolume(name, "ubuntu"))
	}
	h.create(t, imageVM("img-a", "boot-a"))

	t.Run("AVMWaitsPendingForItsImage", func(t *testing.T) {
		vm := h.wait(t, "img-a", 30*time.Second, func(vm *v1alpha1.VirtualMachine) bool {
			return vm.Status.AtProvider.Phase == v1alpha1.PhasePending && vm.GetCondition(xpv2.TypeReady).Message != ""
		})
		assert.Contains(t, vm.GetCondition(xpv2.TypeReady).Message, "waiting for DiskImage ubuntu")
	})

	var phases []v1alpha1.Phase
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		deadline := time.Now().Add(60 * time.Second)
		for time.Now().Before(deadline) {
			vm := &v1alpha1.VirtualMachine{}
			if h.kube.Get(ctx, types.NamespacedName{Namespace: ns, Name: "img-a"}, vm) == nil {
				p := vm.Status.AtProvider.Phase
				if len(phases) == 0 || phases[len(phases)-1] != p {
					phases = append(phases, p)
				}
				if p == v1alpha1.PhaseRunning {
					return
				}
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	h.create(t, &v1alpha1.DiskImage{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "ubuntu"},
		Spec: v1alpha1.DiskImageSpec{ForProvider: v1alpha1.DiskImageParameters{
			Source:     v1alpha1.DiskImageSource{URL: srv.URL + "/ubuntu.qcow2", SHA256: hex.EncodeToString(sum[:])},
			PruneAfter: &metav1.Duration{Duration: imagePruneAfter},
		}},
	})
	h.create(t, imageVM("img-b", "boot-b"))

	t.Run("TheImageShowsItsImportInProgress", func(t *testing.T) {
		img := h.waitImage(t, "ubuntu", 30*time.Second, func(img *v1alpha1.DiskImage) bool {
			return img.Status.AtProvider.Phase == v1alpha1.ImagePhaseImporting
		})
		assert.Contains(t, img.Status.AtProvider.Message, "importing image ubuntu: 0 of ")
		assert.Equal(t, int32(2), img.Status.AtProvider.Users)
		for _, name := range []string{"img-a", "img-b"} {
			vm := h.wait(t, name, 30*time.Second, phase(v1alpha1.PhaseProvisioning))
			assert.Contains(t, vm.GetCondition(xpv2.TypeReady).Message, "importing image ubuntu: ")
		}
	})

	t.Run("VMsGoPendingProvisioningRunningWithOneImport", func(t *testing.T) {
		start := time.Now()
		close(release)
		for _, name := range []string{"img-a", "img-b"} {
			h.wait(t, name, 60*time.Second, running)
		}
		<-watched
		t.Logf("two VMs Running %s after the 8 MiB download was released; phases of img-a: %v", time.Since(start), phases)
		assert.Equal(t, int32(1), requests.Load(), "one import for two Volumes on one node")
		i := slices.Index(phases, v1alpha1.PhaseProvisioning)
		require.GreaterOrEqual(t, i, 0, "phases %v", phases)
		assert.Less(t, i, slices.Index(phases, v1alpha1.PhaseRunning), "Provisioning comes before Running")
		assert.Equal(t, v1alpha1.PhasePending, phases[0])

		img := h.waitImage(t, "ubuntu", 30*time.Second, func(img *v1alpha1.DiskImage) bool {
			return img.Status.AtProvider.Phase == v1alpha1.ImagePhaseReady
		})
		assert.Equal(t, []string{"node1"}, img.Status.AtProvider.Nodes)
		assert.Equal(t, corev1.ConditionTrue, img.GetCondition(xpv2.TypeReady).Status)
		img = h.waitImage(t, "ubuntu", 30*time.Second, func(img *v1alpha1.DiskImage) bool { return img.Status.AtProvider.Size != nil })
		assert.Equal(t, int64(len(data)), img.Status.AtProvider.Size.Value(), "the size is the node's copy of the image")
	})

	img := h.waitImage(t, "ubuntu", 5*time.Second, func(*v1alpha1.DiskImage) bool { return true })
	require.True(t, h.nodeVolumeExists(t, "node1", imageNodeVolume(img)), "the image was imported to the node")
	for _, name := range []string{"boot-a", "boot-b"} {
		require.True(t, h.nodeVolumeExists(t, "node1", ns+"_"+name), "Volume %s was made on the node", name)
	}

	t.Run("DeletedVolumesAreDeletedOnTheNode", func(t *testing.T) {
		for _, name := range []string{"img-a", "img-b"} {
			h.delete(t, name)
		}
		for _, name := range []string{"boot-a", "boot-b"} {
			require.NoError(t, h.kube.Delete(ctx, &v1alpha1.Volume{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}))
		}
		for _, name := range []string{"boot-a", "boot-b"} {
			require.Eventually(t, func() bool {
				return kerrors.IsNotFound(h.kube.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &v1alpha1.Volume{}))
			}, 30*time.Second, 100*time.Millisecond, "Volume %s is finalized", name)
			// The finalizer goes only once the node reported the volume gone.
			assert.False(t, h.nodeVolumeExists(t, "node1", ns+"_"+name), "Volume %s's libvirt volume is deleted", name)
		}
	})
	unused := time.Now()

	t.Run("AnUnusedImageStaysListedOnItsNodeUntilPruned", func(t *testing.T) {
		img := h.waitImage(t, "ubuntu", 10*time.Second, func(img *v1alpha1.DiskImage) bool { return img.Status.AtProvider.Users == 0 })
		require.True(t, h.nodeVolumeExists(t, "node1", imageNodeVolume(img)),
			"the image must still be on the node %s after its last Volume went (pruneAfter %s)", time.Since(unused), imagePruneAfter)
		assert.Equal(t, []string{"node1"}, img.Status.AtProvider.Nodes, "the node still has the image")
		assert.Equal(t, v1alpha1.ImagePhaseReady, img.Status.AtProvider.Phase)
	})

	t.Run("TheImageIsPrunedFromTheNodeAfterPruneAfter", func(t *testing.T) {
		require.Eventually(t, func() bool { return !h.nodeVolumeExists(t, "node1", imageNodeVolume(img)) },
			imagePruneAfter+15*time.Second, 100*time.Millisecond, "the image's node copy is pruned")
		pruned := time.Now()
		t.Logf("image pruned %s after its last Volume was deleted (pruneAfter %s)", pruned.Sub(unused), imagePruneAfter)
		img := h.waitImage(t, "ubuntu", 30*time.Second, func(img *v1alpha1.DiskImage) bool { return len(img.Status.AtProvider.Nodes) == 0 })
		t.Logf("node1 left status.nodes %s after the prune", time.Since(pruned))
		require.NotNil(t, img.Status.AtProvider.Size, "the image keeps its size")
		assert.Equal(t, int64(len(data)), img.Status.AtProvider.Size.Value())
	})

	t.Run("DeletingAReferencedImageIsRefusedThenAllowedOnceUnused", func(t *testing.T) {
		h.create(t, imageVolume("boot-c", "ubuntu"))
		h.waitImage(t, "ubuntu", 10*time.Second, func(img *v1alpha1.DiskImage) bool { return img.Status.AtProvider.Users == 1 })
		require.NoError(t, h.kube.Delete(ctx, &v1alpha1.DiskImage{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "ubuntu"}}))
		require.Eventually(t, func() bool {
			return h.hasEvent(t, "ubuntu", "DeletionBlocked", "DiskImage ubuntu is used by Volume boot-c")
		},
			30*time.Second, 100*time.Millisecond, "a refused deletion records an event")
		img := h.waitImage(t, "ubuntu", 5*time.Second, func(img *v1alpha1.DiskImage) bool { return img.DeletionTimestamp != nil })
		assert.Equal(t, corev1.ConditionTrue, img.GetCondition("InUse").Status)

		require.NoError(t, h.kube.Delete(ctx, &v1alpha1.Volume{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "boot-c"}}))
		require.Eventually(t, func() bool {
			return kerrors.IsNotFound(h.kube.Get(ctx, types.NamespacedName{Namespace: ns, Name: "ubuntu"}, &v1alpha1.DiskImage{}))
		}, 30*time.Second, 100*time.Millisecond, "the image is deleted once no Volume uses it")
	})
}

// TestVolumeDeletion pins when a deleted Volume goes: an unbound one at once;
// a bound one only once its node reported its volume gone, even when the
// agent is away when it is deleted; and one whose node is lost after the
// fencing timeout, its node deleting the volume, and the hub the leftover
// intent, when the agent comes back.
func TestVolumeDeletion(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the whole stack; skipped with -short")
	}
	t.Parallel()
	h := startStack(t, "vf-vol-", stack.Options{Nodes: []string{"node1"}, FencingTimeout: 2 * time.Second})
	ctx := context.Background()
	gone := func(name string) func() bool {
		return func() bool {
			return kerrors.IsNotFound(h.kube.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &v1alpha1.Volume{}))
		}
	}

	t.Run("AnUnboundVolumeGoesAtOnce", func(t *testing.T) {
		h.create(t, volume("loose"))
		require.NoError(t, h.kube.Delete(ctx, volume("loose")))
		require.Eventually(t, gone("loose"), 10*time.Second, 50*time.Millisecond)
	})

	t.Run("ABoundVolumeWaitsForItsNodeToDeleteIt", func(t *testing.T) {
		h.create(t, volume("data"))
		h.create(t, imageVM("user", "data"))
		h.wait(t, "user", 60*time.Second, running)
		h.delete(t, "user")
		require.True(t, h.nodeVolumeExists(t, "node1", ns+"_data"))

		require.NoError(t, h.s.StopAgent("node1"))
		require.NoError(t, h.kube.Delete(ctx, volume("data")))
		assert.Never(t, gone("data"), 3*time.Second, 50*time.Millisecond, "the Volume stays while its node has not deleted the volume")
		assert.True(t, h.nodeVolumeExists(t, "node1", ns+"_data"))

		start := time.Now()
		require.NoError(t, h.s.StartAgent("node1"))
		require.Eventually(t, gone("data"), 30*time.Second, 50*time.Millisecond, "the restarted agent deletes the volume")
		t.Logf("Volume finalized %s after its agent came back", time.Since(start))
		assert.False(t, h.nodeVolumeExists(t, "node1", ns+"_data"))
	})

	t.Run("AVolumeOnALostNodeGoesAfterFencingAndNothingIsLeftOnceTheNodeIsBack", func(t *testing.T) {
		h.create(t, volume("stray"))
		h.create(t, imageVM("stray-user", "stray"))
		h.wait(t, "stray-user", 60*time.Second, running)
		h.delete(t, "stray-user")
		v := &v1alpha1.Volume{}
		require.NoError(t, h.kube.Get(ctx, types.NamespacedName{Namespace: ns, Name: "stray"}, v))
		uid := string(v.UID)
		// The node's own identity reads its keys, as its agent would.
		nc, _ := natstest.Connect(t, h.s.NATS, h.s.AgentIdentities["node1"])
		intentKey, err := wire.VolumeIntents.Key("node1", uid)
		require.NoError(t, err)

		h.s.KillAgent("node1")
		require.NoError(t, h.kube.Delete(ctx, volume("stray")))
		require.Eventually(t, gone("stray"), 45*time.Second, 100*time.Millisecond, "the Volume goes once its node has been lost for the fencing timeout")
		h.assertEvent(t, "stray", "NodeLost", "fencing timeout")
		assert.True(t, kvHas(t, nc, wire.BucketIntents, intentKey), "the intent stays for the node to delete the volume when it is back")
		assert.True(t, h.nodeVolumeExists(t, "node1", ns+"_stray"))

		require.NoError(t, h.s.StartAgent("node1"))
		require.Eventually(t, func() bool { return !h.nodeVolumeExists(t, "node1", ns+"_stray") }, 30*time.Second, 100*time.Millisecond,
			"the agent deletes the volume once it is back")
		require.Eventually(t, func() bool {
			return !kvHas(t, nc, wire.BucketIntents, intentKey) && !kvHas(t, nc, wire.BucketReports, intentKey)
		}, 30*time.Second, 100*time.Millisecond, "the hub deletes the leftover intent, and the volume's report goes")
	})
}

// kvHas reads key of bucket through JetStream's direct get, as an agent does.
func kvHas(t *testing.T, nc *nats.Conn, bucket, key string) bool {
	t.Helper()
	stream := wire.Stream(bucket)
	if bucket == wire.BucketReports {
		// A node reads its reports in its own stream, not in the bucket
		// that sources every node's.
		var err error
		stream, err = natswire.NodeReportsStreamOfKey(key)
		require.NoError(t, err)
	}
	m, err := nc.Request("$JS.API.DIRECT.GET."+stream+"."+wire.Subject(bucket, key), nil, 5*time.Second)
	require.NoError(t, err)
	switch m.Header.Get("Status") {
	case "":
		return m.Header.Get("KV-Operation") == "" && m.Header.Get("Nats-Marker-Reason") == ""
	case "404":
		return false
	default:
		require.FailNow(t, "direct get failed", "%s %s", m.Header.Get("Status"), m.Header.Get("Description"))
		return false
	}
}

// imagePruneAfter is the DiskImage's pruneAfter: short, so that the test sees
// its node copy pruned, and long enough to see it listed on its node after
// its last Volume went.
const imagePruneAfter = 8 * time.Second

// imageNodeVolume is the libvirt volume an image is kept in on a node.
func imageNodeVolume(img *v1alpha1.DiskImage) string { return "image_" + string(img.UID) }

// nodeVolumeExists looks behind virtfleet's back for a volume in the node's
// storage pool.
func (h *hub) nodeVolumeExists(t *testing.T, node, name string) bool {
	t.Helper()
	l, err := h.s.Nodes[node].Dial()
	require.NoError(t, err)
	defer func() { _ = l.Disconnect() }()
	p, err := l.StoragePoolLookupByName(libvirttest.Pool)
	require.NoError(t, err)
	_, err = l.StorageVolLookupByName(p, name)
	if err != nil {
		var le libvirt.Error
		require.True(t, errors.As(err, &le) && le.Code == uint32(libvirt.ErrNoStorageVol), "cannot look up volume %s: %v", name, err)
		return false
	}
	return true
}

func (h *hub) waitImage(t *testing.T, name string, timeout time.Duration, ok func(*v1alpha1.DiskImage) bool) *v1alpha1.DiskImage {
	t.Helper()
	img := &v1alpha1.DiskImage{}
	require.Eventually(t, func() bool {
		return h.kube.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, img) == nil && ok(img)
	}, timeout, 50*time.Millisecond, "DiskImage %s: last status %+v", name, &img.Status.AtProvider)
	return img
}

func imageVolume(name, image string) *v1alpha1.Volume {
	v := volume(name)
	v.Spec.ForProvider.Source = &v1alpha1.VolumeSource{DiskImageRef: &v1alpha1.LocalReference{Name: v1alpha1.LocalName(image)}}
	return v
}

// imageVM is a small VM without networks that boots from disk.
func imageVM(name, disk string) *v1alpha1.VirtualMachine {
	return &v1alpha1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1alpha1.VirtualMachineSpec{ForProvider: v1alpha1.VirtualMachineParameters{
			Vcpu:            1,
			Memory:          resource.MustParse("128Mi"),
			DiskAttachments: []v1alpha1.DiskAttachment{{Name: v1alpha1.LocalName(disk)}},
		}},
	}
}
