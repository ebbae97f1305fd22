package libvirt

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"libvirt.org/go/libvirtxml"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/agent/driver/imageimport"
	"github.com/virtfleet/virtfleet/internal/harness/diskimagetest"
	"github.com/virtfleet/virtfleet/internal/harness/libvirttest"
)

// imageServer serves a generated qcow2 image on 127.0.0.1 and counts the
// requests for it. While gate is set, responses wait for it to close, so a test can
// hold an import in flight.
type imageServer struct {
	*httptest.Server
	data     []byte
	sum      string
	requests atomic.Int32
	// status, when non-zero, is answered instead of the image.
	status atomic.Int32
	gate   chan struct{}
}

func serveImage(t *testing.T, size int) *imageServer {
	t.Helper()
	return serveData(t, diskimagetest.QCOW2(size))
}

// serveRawImage serves a generated raw image: random bytes, which no
// header's magic starts.
func serveRawImage(t *testing.T, size int) *imageServer {
	t.Helper()
	data := make([]byte, size)
	_, _ = rand.Read(data)
	data[0] = 0
	return serveData(t, data)
}

// serveData serves data as an image.
func serveData(t *testing.T, data []byte) *imageServer {
	t.Helper()
	s := &imageServer{data: data}
	h := sha256.Sum256(s.data)
	s.sum = hex.EncodeToString(h[:])
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.requests.Add(1)
		if s.gate != nil {
			<-s.gate
		}
		if code := s.status.Load(); code != 0 {
			http.Error(w, http.StatusText(int(code)), int(code))
			return
		}
		http.ServeContent(w, r, "disk.qcow2", time.Time{}, bytes.NewReader(s.data))
	}))
	t.Cleanup(s.Close)
	return s
}

// hold makes responses wait until release is called. A test that fails
// before it releases them releases them at cleanup, which runs before the
// server's Close: otherwise Close would wait for the held responses forever
// and hang the test binary instead of reporting the failure.
func (s *imageServer) hold(t *testing.T) (release func()) {
	s.gate = make(chan struct{})
	var once sync.Once
	release = func() { once.Do(func() { close(s.gate) }) }
	t.Cleanup(release)
	return release
}

// loopback is the allowed source of images served by imageServer.
var loopback = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}

func (s *imageServer) image(uid string) *driver.Image {
	return &driver.Image{UID: uid, Name: "ubuntu", URL: s.URL + "/disk.qcow2", SHA256: s.sum, Format: "qcow2", PruneAfter: time.Hour, AllowedSources: loopback}
}

// imageMachine is a guest whose boot disk is made from img.
func imageMachine(name string, img *driver.Image) driver.Machine {
	m := machine(name)
	m.Disks[0].Image, m.Disks[0].Format = img, img.Format
	return m
}

// ensureUntil calls Ensure, as the reconciler does, until the guest leaves
// Provisioning or Ensure fails.
func ensureUntil(t *testing.T, d *Driver, m driver.Machine) (driver.Observation, error) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		o, err := d.Ensure(context.Background(), m)
		if err != nil || o.Phase != driver.PhaseProvisioning || time.Now().After(deadline) {
			return o, err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// useImports gives d a new import store configured as cfg, on d's clock;
// a test calls it before d imports anything.
func useImports(d *Driver, cfg imageimport.Config) { d.images = d.newImports(cfg) }

func volumeXML(t *testing.T, n *libvirttest.Node, name string) libvirtxml.StorageVolume {
	t.Helper()
	l := raw(t, n)
	p, err := l.StoragePoolLookupByName(testPool)
	require.NoError(t, err)
	v, err := l.StorageVolLookupByName(p, name)
	require.NoError(t, err)
	x, err := l.StorageVolGetXMLDesc(v, 0)
	require.NoError(t, err)
	var def libvirtxml.StorageVolume
	require.NoError(t, def.Unmarshal(x))
	return def
}

func TestImageIsImportedOncePerNode(t *testing.T) {
	node := libvirttest.Start(t, "img-once")
	d := open(t, node)
	useImports(d, imageimport.Config{Dir: t.TempDir()})
	srv := serveImage(t, 4<<20)
	release := srv.hold(t)
	img := srv.image("5d1c0e6a-0000-4000-8000-000000000001")

	machines := make([]driver.Machine, 10)
	for i := range machines {
		machines[i] = imageMachine(fmt.Sprintf("vm%d", i), img)
	}

	// Every guest asks for the image while the one download is held open.
	for _, m := range machines {
		o, err := d.Ensure(context.Background(), m)
		require.NoError(t, err)
		assert.Equal(t, driver.PhaseProvisioning, o.Phase)
		assert.Contains(t, o.Message, "importing image ubuntu: ")
	}
	start := time.Now()
	release()

	var wg sync.WaitGroup
	phases := make([]driver.Phase, len(machines))
	for i, m := range machines {
		wg.Go(func() {
			o, err := ensureUntil(t, d, m)
			assert.NoError(t, err)
			phases[i] = o.Phase
		})
	}
	wg.Wait()
	t.Logf("10 guests from one 4 MiB image: running %s after the download was released, %d request(s)", time.Since(start), srv.requests.Load())

	assert.Equal(t, int32(1), srv.requests.Load(), "one download for ten disks")
	image := volumeXML(t, node, imageVolume(img.UID))
	assert.Equal(t, uint64(len(srv.data)), image.Capacity.Value, "the image volume has the download's size")
	for i, m := range machines {
		assert.Equal(t, driver.PhaseRunning, phases[i], m.Name)
		disk := volumeXML(t, node, m.Disks[0].Name)
		require.NotNil(t, disk.BackingStore, "%s is an overlay of the image", m.Name)
		assert.Equal(t, image.Target.Path, disk.BackingStore.Path)
		assert.Equal(t, uint64(m.Disks[0].SizeBytes), disk.Capacity.Value)
	}
	left, _ := filepath.Glob(filepath.Join(d.images.Dir(), "*"))
	assert.Empty(t, left, "the verified download is removed once imported")
}

func TestImageImportFailures(t *testing.T) {
	node := libvirttest.Start(t, "img-fail")
	d := open(t, node)

	closed, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	unreachable := "http://" + closed.Addr().String() + "/disk.qcow2"
	require.NoError(t, closed.Close())

	cases := map[string]struct {
		change func(t *testing.T, s *imageServer, img *driver.Image)
		want   []string
	}{
		"NotFoundNamesTheURLAndStatus": {
			change: func(_ *testing.T, s *imageServer, _ *driver.Image) { s.status.Store(http.StatusNotFound) },
			want:   []string{"cannot import image ubuntu: GET http://127.0.0.1:", "/disk.qcow2 answered 404 Not Found"},
		},
		"ChecksumMismatchNamesBothDigests": {
			change: func(_ *testing.T, s *imageServer, img *driver.Image) {
				img.SHA256 = "0000000000000000000000000000000000000000000000000000000000000000"
			},
			want: []string{"failed its checksum: expected sha256 0000000000000000000000000000000000000000000000000000000000000000, got ", "nothing was kept"},
		},
		"UnreachableServerSaysSo": {
			change: func(_ *testing.T, _ *imageServer, img *driver.Image) { img.URL = unreachable },
			want:   []string{"cannot import image ubuntu: ", "connection refused"},
		},
		"FullPoolNamesThePoolAndSpace": {
			change: func(t *testing.T, s *imageServer, _ *driver.Image) { fillPool(t, node, int64(len(s.data))/2) },
			want:   []string{"cannot import image ubuntu: it needs 1048576 bytes but storage pool \"default-pool\" on node img-fail has "},
		},
	}
	i := 0
	for name, tc := range cases {
		i++
		t.Run(name, func(t *testing.T) {
			useImports(d, imageimport.Config{Dir: t.TempDir()})
			srv := serveImage(t, 1<<20)
			img := srv.image(fmt.Sprintf("5d1c0e6a-0000-4000-8000-0000000001%02d", i))
			tc.change(t, srv, img)
			m := imageMachine("fail", img)

			_, err := ensureUntil(t, d, m)
			require.Error(t, err)
			assert.True(t, driver.IsFailing(err), "shown to the user and retried: %v", err)
			for _, w := range tc.want {
				assert.Contains(t, err.Error(), w)
			}
			l := raw(t, node)
			assert.False(t, volumeExists(t, l, imageVolume(img.UID)), "no half-written image in the pool")
			assert.False(t, volumeExists(t, l, m.Disks[0].Name), "no disk without its image")
			left, _ := filepath.Glob(filepath.Join(d.images.Dir(), "*"))
			assert.Empty(t, left, "no download left behind")
		})
	}
}

// fillPool leaves about free bytes free in the node's pool.
func fillPool(t *testing.T, n *libvirttest.Node, free int64) {
	t.Helper()
	l := raw(t, n)
	p, err := l.StoragePoolLookupByName(testPool)
	require.NoError(t, err)
	_, _, _, available, err := l.StoragePoolGetInfo(p)
	require.NoError(t, err)
	x, err := (&libvirtxml.StorageVolume{
		Name:     "filler",
		Capacity: &libvirtxml.StorageVolumeSize{Value: available - uint64(free), Unit: "B"},
	}).Marshal()
	require.NoError(t, err)
	v, err := l.StorageVolCreateXML(p, x, 0)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.StorageVolDelete(v, 0) })
}

func TestFailedImportIsRetriedWithBackoff(t *testing.T) {
	node := libvirttest.Start(t, "img-retry")
	d := open(t, node)
	// The driver's clock moves only when the test says: on a loaded
	// machine the calls below may take longer than any backoff short
	// enough for a test.
	var mu sync.Mutex
	now := time.Now()
	d.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	const backoff = 5 * time.Second
	useImports(d, imageimport.Config{Dir: t.TempDir(), RetryBase: backoff})
	srv := serveImage(t, 1<<20)
	srv.status.Store(http.StatusNotFound)
	m := imageMachine("retry", srv.image("5d1c0e6a-0000-4000-8000-000000000201"))

	_, err := ensureUntil(t, d, m)
	require.Error(t, err)
	st, ok := imageStatus(t, d, m.Disks[0].Image.UID)
	require.True(t, ok)
	require.False(t, st.ImportFinished.IsZero(), "the failed import says when it ended")
	// Within the backoff Ensure answers with the failure and does not
	// download again, however often it is called.
	for range 5 {
		_, err := d.Ensure(context.Background(), m)
		require.ErrorContains(t, err, "answered 404 Not Found")
	}
	mu.Lock()
	now = now.Add(backoff - time.Millisecond)
	mu.Unlock()
	_, err = d.Ensure(context.Background(), m)
	require.ErrorContains(t, err, "answered 404 Not Found", "a moment before the backoff ends")
	assert.Equal(t, int32(1), srv.requests.Load(), "no retry within the backoff")

	srv.status.Store(0) // the image appears on the server
	mu.Lock()
	now = now.Add(time.Millisecond)
	mu.Unlock()
	// The reconciler calls again after its own backoff; so does this.
	require.Eventually(t, func() bool {
		o, err := ensureUntil(t, d, m)
		return err == nil && o.Phase == driver.PhaseRunning
	}, 10*time.Second, 50*time.Millisecond)
	assert.Equal(t, int32(2), srv.requests.Load(), "retried once the backoff ended")
}

func TestUnusedImagesArePrunedAfterPruneAfter(t *testing.T) {
	node := libvirttest.Start(t, "img-prune")
	d := open(t, node)
	useImports(d, imageimport.Config{Dir: t.TempDir()})
	now := time.Now()
	d.now = func() time.Time { return now }
	srv := serveImage(t, 1<<20)
	qcow := srv.image("5d1c0e6a-0000-4000-8000-000000000301")
	rawImg := serveRawImage(t, 1<<20).image("5d1c0e6a-0000-4000-8000-000000000302")
	rawImg.Format, rawImg.PruneAfter = "raw", 2*time.Hour

	used := imageMachine("used", qcow)
	copied := imageMachine("copied", rawImg)
	for _, m := range []driver.Machine{used, copied} {
		o, err := ensureUntil(t, d, m)
		require.NoError(t, err)
		require.Equal(t, driver.PhaseRunning, o.Phase)
	}
	assert.Nil(t, volumeXML(t, node, copied.Disks[0].Name).BackingStore, "a disk from a raw image is a copy")

	l := raw(t, node)
	steps := []struct {
		name    string
		act     func(t *testing.T)
		advance time.Duration
		pruned  []string
	}{
		{name: "AnImageADiskIsBackedByStays", act: func(*testing.T) {}, advance: 3 * time.Hour},
		{name: "ACopiedImageIsPrunedAfterItsPruneAfter", act: func(*testing.T) {}, advance: 0, pruned: []string{rawImg.UID}},
		{name: "AnImageWhoseLastDiskWentStartsItsClock", act: func(t *testing.T) {
			require.NoError(t, d.Delete(context.Background(), used.UID))
			p, err := l.StoragePoolLookupByName(testPool)
			require.NoError(t, err)
			v, err := l.StorageVolLookupByName(p, used.Disks[0].Name)
			require.NoError(t, err)
			require.NoError(t, l.StorageVolDelete(v, 0))
		}, advance: 59 * time.Minute},
		{name: "ItStaysUntilItsPruneAfterHasPassed", act: func(*testing.T) {}, advance: time.Minute},
		{name: "ThenItIsPruned", act: func(*testing.T) {}, pruned: []string{qcow.UID}},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			s.act(t)
			pruned, err := d.PruneImages(context.Background())
			require.NoError(t, err)
			assert.ElementsMatch(t, s.pruned, pruned)
			for _, uid := range s.pruned {
				assert.False(t, volumeExists(t, l, imageVolume(uid)))
			}
			now = now.Add(s.advance)
		})
	}

	t.Run("APrunedImageIsImportedAgainWhenNeeded", func(t *testing.T) {
		again := imageMachine("again", qcow)
		o, err := ensureUntil(t, d, again)
		require.NoError(t, err)
		assert.Equal(t, driver.PhaseRunning, o.Phase)
		assert.True(t, volumeExists(t, l, imageVolume(qcow.UID)))
	})
}

func TestImageDoesNotRewriteAnExistingDisk(t *testing.T) {
	node := libvirttest.Start(t, "img-keep")
	d := open(t, node)
	srv := serveImage(t, 1<<20)
	m := machine("keep")
	_, err := d.Ensure(context.Background(), m)
	require.NoError(t, err)

	m.Disks[0].Image = srv.image("5d1c0e6a-0000-4000-8000-000000000401")
	o, err := d.Ensure(context.Background(), m)
	require.NoError(t, err)
	assert.Equal(t, driver.PhaseRunning, o.Phase)
	assert.False(t, o.RestartRequired, "an image only fills a new disk; it changes no guest")
	assert.Zero(t, srv.requests.Load(), "no import for a disk that exists")
}

// TestImportInterruptedByAStoppedAgent stops the driver (the agent) while an
// image download is under way: nothing half-written may stay in the pool or
// the download directory, and a new driver finishes the import.
func TestImportInterruptedByAStoppedAgent(t *testing.T) {
	node := libvirttest.Start(t, "img-stop")
	srv := serveImage(t, 4<<20)
	release := srv.hold(t)
	img := srv.image("5d1c0e6a-0000-4000-8000-0000000000aa")
	m := imageMachine("vm", img)
	dir := t.TempDir()

	first := open(t, node)
	useImports(first, imageimport.Config{Dir: dir})
	o, err := first.Ensure(context.Background(), m)
	require.NoError(t, err)
	require.Equal(t, driver.PhaseProvisioning, o.Phase)
	require.Eventually(t, func() bool { return srv.requests.Load() == 1 }, 5*time.Second, 10*time.Millisecond, "the download has started")
	require.NoError(t, first.Close(), "the agent stops mid-download")

	l := raw(t, node)
	pool, err := l.StoragePoolLookupByName(testPool)
	require.NoError(t, err)
	for _, name := range []string{imageVolume(img.UID), m.Disks[0].Name} {
		_, err := l.StorageVolLookupByName(pool, name)
		assert.Error(t, err, "volume %s must not exist after an interrupted import", name)
	}
	left, _ := filepath.Glob(filepath.Join(dir, "*"))
	assert.Empty(t, left, "no partial download is left behind")

	release()
	second := open(t, node)
	useImports(second, imageimport.Config{Dir: dir})
	o, err = ensureUntil(t, second, m)
	require.NoError(t, err)
	assert.Equal(t, driver.PhaseRunning, o.Phase, "the restarted agent finishes the import")
	assert.Equal(t, int32(2), srv.requests.Load(), "one download per attempt")
	assert.Equal(t, uint64(len(srv.data)), volumeXML(t, node, imageVolume(img.UID)).Capacity.Value)
}

// TestDeleteVolume deletes an image-backed disk as a deleted Volume does: it
// is refused while its guest has it, goes once the guest is gone, and the
// image it was made from is then pruned after its PruneAfter.
func TestDeleteVolume(t *testing.T) {
	ctx := context.Background()
	node := libvirttest.Start(t, "vol-del")
	d := open(t, node)
	useImports(d, imageimport.Config{Dir: t.TempDir()})
	now := time.Now()
	d.now = func() time.Time { return now }
	img := serveImage(t, 1<<20).image("5d1c0e6a-0000-4000-8000-000000000401")
	m := imageMachine("booted", img)
	other := machine("other")
	for _, g := range []driver.Machine{m, other} {
		o, err := ensureUntil(t, d, g)
		require.NoError(t, err)
		require.Equal(t, driver.PhaseRunning, o.Phase)
	}
	disk := driver.Disk{Name: m.Disks[0].Name}
	l := raw(t, node)

	steps := []struct {
		name string
		act  func(t *testing.T)
	}{
		{name: "RefusedWhileItsGuestHasIt", act: func(t *testing.T) {
			err := d.DeleteVolume(ctx, disk)
			require.True(t, driver.IsInUse(err), "got %v", err)
			assert.Contains(t, err.Error(), "attached to guest "+m.UID)
			assert.True(t, volumeExists(t, l, disk.Name))
		}},
		{name: "RefusedWhileTheGuestIsStopped", act: func(t *testing.T) {
			stopped := m
			stopped.Running = false
			_, err := d.Ensure(ctx, stopped)
			require.NoError(t, err)
			require.Eventually(t, func() bool {
				o, err := d.Ensure(ctx, stopped)
				return err == nil && o.Phase == driver.PhaseStopped
			}, 5*time.Second, 50*time.Millisecond)
			assert.True(t, driver.IsInUse(d.DeleteVolume(ctx, disk)))
		}},
		{name: "DeletedOnceTheGuestIsGone", act: func(t *testing.T) {
			require.NoError(t, d.Delete(ctx, m.UID))
			require.NoError(t, d.DeleteVolume(ctx, disk))
			assert.False(t, volumeExists(t, l, disk.Name))
			assert.True(t, volumeExists(t, l, other.Disks[0].Name), "another guest's volume stays")
			assert.True(t, volumeExists(t, l, imageVolume(img.UID)), "the image stays until its PruneAfter")
		}},
		{name: "DeletingAnAbsentVolumeSucceeds", act: func(t *testing.T) {
			require.NoError(t, d.DeleteVolume(ctx, disk))
			require.NoError(t, d.DeleteVolume(ctx, driver.Disk{Name: "never-there", Pool: testPool}))
		}},
		{name: "TheImageIsPrunedAfterItsPruneAfter", act: func(t *testing.T) {
			pruned, err := d.PruneImages(ctx)
			require.NoError(t, err)
			assert.Empty(t, pruned, "the clock starts when the last disk went")
			now = now.Add(img.PruneAfter)
			pruned, err = d.PruneImages(ctx)
			require.NoError(t, err)
			assert.Equal(t, []string{img.UID}, pruned)
			assert.False(t, volumeExists(t, l, imageVolume(img.UID)))
		}},
	}
	for _, s := range steps {
		if !t.Run(s.name, s.act) {
			return
		}
	}
}

// TestImagesTheNodeRefusesAreTerminal: a download the node's policy refuses
// fails its guest as Terminal (only a changed image can mend it), is
// reported Failed with the reason, and leaves nothing behind.
func TestImagesTheNodeRefusesAreTerminal(t *testing.T) {
	node := libvirttest.Start(t, "img-refuse")
	d := open(t, node)
	top := diskimagetest.QCOW2(1 << 20)
	top[15] = 1 // the offset of a backing file's name in the header

	cases := map[string]struct {
		serve    func(t *testing.T) *imageServer
		change   func(img *driver.Image)
		maxBytes int64
		want     string
		requests int32
	}{
		"AServerOnLoopbackNotAllowed": {
			serve:  func(t *testing.T) *imageServer { return serveImage(t, 1<<20) },
			change: func(img *driver.Image) { img.AllowedSources = nil },
			want:   "cannot import image ubuntu: address 127.0.0.1 is loopback and not among the image's allowed sources: refused",
		},
		"AQcow2NamingABackingFile": {
			serve:    func(t *testing.T) *imageServer { return serveData(t, top) },
			change:   func(*driver.Image) {},
			want:     "cannot import image ubuntu: qcow2 image names a backing file: refused",
			requests: 1,
		},
		"AnImageOverTheSizeCap": {
			serve:    func(t *testing.T) *imageServer { return serveImage(t, 1<<20) },
			change:   func(*driver.Image) {},
			maxBytes: 1 << 19,
			want:     "cannot import image ubuntu: the image from 127.0.0.1 is 1048576 bytes, over this node's limit of 524288 bytes (512Ki): refused",
			requests: 1,
		},
	}
	i := 0
	for name, tc := range cases {
		i++
		t.Run(name, func(t *testing.T) {
			useImports(d, imageimport.Config{Dir: t.TempDir(), MaxBytes: tc.maxBytes})
			srv := tc.serve(t)
			img := srv.image(fmt.Sprintf("5d1c0e6a-0000-4000-8000-0000000005%02d", i))
			tc.change(img)
			m := imageMachine(fmt.Sprintf("refused%d", i), img)

			_, err := ensureUntil(t, d, m)
			require.Error(t, err)
			assert.True(t, driver.IsTerminal(err), "not retried until the image changes: %v", err)
			assert.EqualError(t, err, tc.want)
			assert.Equal(t, tc.requests, srv.requests.Load(), "requests to the image's server")

			st, ok := imageStatus(t, d, img.UID)
			require.True(t, ok, "the refused image is listed")
			assert.False(t, st.ImportFinished.IsZero(), "with when the refused import ended")
			st.ImportStarted, st.ImportFinished = time.Time{}, time.Time{}
			assert.Equal(t, driver.ImageStatus{UID: img.UID, Name: "ubuntu", Phase: driver.ImagePhaseFailed, Message: tc.want}, st)
			l := raw(t, node)
			assert.False(t, volumeExists(t, l, imageVolume(img.UID)), "no refused image in the pool")
			assert.False(t, volumeExists(t, l, m.Disks[0].Name), "no disk without its image")
			left, _ := filepath.Glob(filepath.Join(d.images.Dir(), "*"))
			assert.Empty(t, left, "no download left behind")
		})
	}
}

// TestARefusedImageIsImportedOnceItsSourceIsAllowed: the failure's backoff
// belongs to the image as it was; once an administrator allows its source,
// the changed image is imported at once.
func TestARefusedImageIsImportedOnceItsSourceIsAllowed(t *testing.T) {
	node := libvirttest.Start(t, "img-granted")
	d := open(t, node)
	useImports(d, imageimport.Config{Dir: t.TempDir(), RetryBase: time.Hour})
	srv := serveImage(t, 1<<20)
	img := srv.image("5d1c0e6a-0000-4000-8000-000000000601")
	img.AllowedSources = nil

	_, err := ensureUntil(t, d, imageMachine("granted", img))
	require.ErrorContains(t, err, "is loopback and not among the image's allowed sources: refused")
	_, err = d.Ensure(context.Background(), imageMachine("granted", img))
	require.ErrorContains(t, err, "refused", "the same image stays refused within its backoff")

	granted := *img
	granted.AllowedSources = loopback
	o, err := ensureUntil(t, d, imageMachine("granted", &granted))
	require.NoError(t, err)
	assert.Equal(t, driver.PhaseRunning, o.Phase)
	assert.Equal(t, int32(1), srv.requests.Load())
}

// TestAnImageByExternalNameIsRefused: a libvirt node imports images from a
// url or a Volume only; a DiskImage naming an image by external name is
// Terminal, and nothing is made.
func TestAnImageByExternalNameIsRefused(t *testing.T) {
	node := libvirttest.Start(t, "img-ext")
	d := open(t, node)
	img := &driver.Image{UID: "5d1c0e6a-0000-4000-8000-000000000601", Name: "golden", ExternalName: "debian-12-golden"}
	m := imageMachine("golden", img)
	_, err := d.Ensure(context.Background(), m)
	require.Error(t, err)
	assert.True(t, driver.IsTerminal(err), "not retried: %v", err)
	assert.ErrorContains(t, err, `imports "debian-12-golden" by external name`)
	assert.False(t, volumeExists(t, raw(t, node), m.Disks[0].Name), "nothing made")
	st, err := d.Images(context.Background())
	require.NoError(t, err)
	assert.Empty(t, st, "and nothing imported")
}
