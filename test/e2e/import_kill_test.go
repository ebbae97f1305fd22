package e2e

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/harness/diskimagetest"
	"github.com/virtfleet/virtfleet/internal/harness/libvirttest"
	"github.com/virtfleet/virtfleet/internal/harness/stack"
)

// TestImportKill kills an agent with SIGKILL in the middle of an image
// download and pins that the pool holds no half-written image, that the
// partial download left behind is cleaned up by the restarted agent, and
// that the restarted agent imports the image afresh and boots the VM.
func TestImportKill(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the whole stack; skipped with -short")
	}
	t.Parallel()
	const node = "node1"
	h := startStack(t, "vf-kill-", stack.Options{Nodes: []string{node}})

	// The first request gets a third of the image and then hangs, as a slow
	// mirror would, until the agent goes away; later ones wait for release
	// and get all of it.
	data := diskimagetest.QCOW2(3 << 20)
	sum := sha256.Sum256(data)
	var requests atomic.Int32
	partialSent, release := make(chan struct{}), make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if requests.Add(1) == 1 {
			w.Header().Set("Content-Length", strconv.Itoa(len(data)))
			w.WriteHeader(http.StatusOK)
			_, _ = w.Write(data[:len(data)/3])
			w.(http.Flusher).Flush()
			close(partialSent)
			<-r.Context().Done()
			return
		}
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
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

	h.create(t, &v1alpha1.DiskImage{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "ubuntu"},
		Spec: v1alpha1.DiskImageSpec{ForProvider: v1alpha1.DiskImageParameters{
			Source: v1alpha1.DiskImageSource{URL: srv.URL + "/ubuntu.qcow2", SHA256: hex.EncodeToString(sum[:])},
		}},
	})
	h.create(t, imageVolume("boot", "ubuntu"))
	h.create(t, imageVM("killed", "boot"))
	img := h.waitImage(t, "ubuntu", 30*time.Second, func(img *v1alpha1.DiskImage) bool { return img.UID != "" })
	imageVol := imageNodeVolume(img)
	downloads := filepath.Join(h.s.Nodes[node].Dir, "images")

	var partial string
	t.Run("TheImportIsUnderWay", func(t *testing.T) {
		select {
		case <-partialSent:
		case <-time.After(30 * time.Second):
			require.FailNow(t, "the agent never asked for the image")
		}
		vm := h.wait(t, "killed", 30*time.Second, phase(v1alpha1.PhaseProvisioning))
		assert.Contains(t, vm.GetCondition(xpv2.TypeReady).Message, "importing image ubuntu: ")
		// The bytes sent have reached the download file.
		require.Eventually(t, func() bool {
			partial = partialDownload(t, downloads, imageVol)
			if partial == "" {
				return false
			}
			fi, err := os.Stat(partial)
			return err == nil && fi.Size() == int64(len(data)/3)
		}, 10*time.Second, 20*time.Millisecond, "a third of the image is in a download file in %s", downloads)
		assert.Empty(t, imageVolumes(t, h, node), "the image is not in the pool while it downloads")
	})
	require.NotEmpty(t, partial)

	h.s.KillAgent(node)

	t.Run("NothingHalfWrittenIsInThePool", func(t *testing.T) {
		assert.Empty(t, imageVolumes(t, h, node), "the pool holds no image volume while the download is incomplete")
		assert.FileExists(t, partial, "the killed agent could not clean up its download")
		assert.Equal(t, int32(1), requests.Load())
	})

	close(release)
	start := time.Now()
	require.NoError(t, h.s.StartAgent(node))

	t.Run("TheRestartedAgentImportsAgainAndTheVMRuns", func(t *testing.T) {
		h.wait(t, "killed", 60*time.Second, running)
		t.Logf("VM Running %s after the agent was restarted", time.Since(start))
		assert.Equal(t, int32(2), requests.Load(), "the image was downloaded once more, in full")
		assert.Equal(t, []string{imageVol}, imageVolumes(t, h, node), "the image is in the pool once")
		assert.True(t, h.nodeVolumeExists(t, node, ns+"_boot"), "the Volume was made from the image")
		assert.NoFileExists(t, partial, "the restarted agent removed the killed one's partial download")
		assert.Empty(t, partialDownload(t, downloads, imageVol), "no download file is left once the import finished")
	})
}

// partialDownload is the path of the download file of image volume vol in
// dir, or "".
func partialDownload(t *testing.T, dir, vol string) string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, vol+"-*.part"))
	require.NoError(t, err)
	require.LessOrEqual(t, len(files), 1, "one download at a time: %v", files)
	if len(files) == 0 {
		return ""
	}
	return files[0]
}

// imageVolumes lists the image volumes in node's pool, looking behind
// virtfleet's back.
func imageVolumes(t *testing.T, h *hub, node string) []string {
	t.Helper()
	l, err := h.s.Nodes[node].Dial()
	require.NoError(t, err)
	defer func() { _ = l.Disconnect() }()
	p, err := l.StoragePoolLookupByName(libvirttest.Pool)
	require.NoError(t, err)
	vols, _, err := l.StoragePoolListAllVolumes(p, 1, 0)
	require.NoError(t, err)
	var names []string
	for _, v := range vols {
		if strings.HasPrefix(v.Name, "image_") {
			names = append(names, v.Name)
		}
	}
	return names
}
