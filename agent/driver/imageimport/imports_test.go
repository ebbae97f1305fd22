package imageimport

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/internal/harness/diskimagetest"
)

// backend is what a driver keeps of images, as Ensure's present and run see
// it: run stores the image unless fail says otherwise, and may be held at
// a gate.
type backend struct {
	mu      sync.Mutex
	present map[string]bool
	runs    atomic.Int32
	// fail, when set, is what run returns instead of storing the image.
	fail error
	// gate, when set, holds run until it is closed.
	gate chan struct{}
	// ctx is the context the last run got.
	ctx context.Context
}

func newBackend() *backend { return &backend{present: map[string]bool{}} }

func (b *backend) has(uid string) func() (bool, error) {
	return func() (bool, error) {
		b.mu.Lock()
		defer b.mu.Unlock()
		return b.present[uid], nil
	}
}

func (b *backend) run(ctx context.Context, img *driver.Image, job *Job) error {
	job.SetProgress(3, 10)
	b.runs.Add(1)
	b.mu.Lock()
	gate, fail := b.gate, b.fail
	b.ctx = ctx
	b.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if fail != nil {
		return fail
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.present[img.UID] = true
	return nil
}

func (b *backend) set(uid string, present bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.present[uid] = present
}

// settle waits for the import of uid, if any, to finish.
func settle(t *testing.T, s *Imports, uid string) {
	t.Helper()
	s.mu.Lock()
	job := s.jobs[uid]
	s.mu.Unlock()
	if job == nil {
		return
	}
	select {
	case <-job.done:
	case <-time.After(5 * time.Second):
		require.Fail(t, "the import did not finish")
	}
}

// clock is a store's clock that only the test moves.
type clock struct{ now time.Time }

func (c *clock) Now() time.Time { return c.now }

func testImage(uid string) *driver.Image {
	return &driver.Image{UID: uid, Name: "ubuntu", URL: "http://127.0.0.1/disk.qcow2", Format: "qcow2"}
}

func TestConcurrentEnsuresShareOneImport(t *testing.T) {
	s := New(Config{Dir: t.TempDir()})
	b := newBackend()
	b.gate = make(chan struct{})
	img := testImage("5d1c0e6a-0000-4000-8000-000000000a01")

	var wg sync.WaitGroup
	for range 10 {
		wg.Go(func() {
			msg, err := s.Ensure(context.Background(), img, b.has(img.UID), b.run)
			assert.NoError(t, err)
			assert.Contains(t, msg, "importing image ubuntu: ")
		})
	}
	wg.Wait()
	require.Eventually(t, func() bool { return b.runs.Load() == 1 }, 5*time.Second, 10*time.Millisecond)
	msg, err := s.Ensure(context.Background(), img, b.has(img.UID), b.run)
	require.NoError(t, err)
	assert.Equal(t, "importing image ubuntu: 3 of 10 bytes", msg, "the progress the import set")

	close(b.gate)
	settle(t, s, img.UID)
	msg, err = s.Ensure(context.Background(), img, b.has(img.UID), b.run)
	require.NoError(t, err)
	assert.Empty(t, msg, "the image is present")
	assert.Equal(t, int32(1), b.runs.Load(), "one import for every Ensure")
}

// TestEnsureRetries walks one image through the state machine of its
// imports: each step changes the image, the backend or the clock, calls
// Ensure, and says what it must return and how many imports ran by then.
func TestEnsureRetries(t *testing.T) {
	broken := errors.New("GET answered 404 Not Found")
	c := &clock{now: time.Now()}
	s := New(Config{Dir: t.TempDir(), RetryBase: time.Minute, RetryMax: 3 * time.Minute, Now: c.Now})
	b := newBackend()
	img := testImage("5d1c0e6a-0000-4000-8000-000000000a02")

	steps := []struct {
		name string
		act  func()
		// importing says Ensure reports an import's progress; else it
		// returns wantErr's error, or nothing once the image is present.
		importing bool
		wantErr   func(err error) bool
		runs      int32
	}{
		{name: "AFirstImportStarts", act: func() { b.fail = broken }, importing: true, runs: 1},
		{name: "ItsFailureIsFailing", act: func() {}, wantErr: func(err error) bool { return driver.IsFailing(err) && !driver.IsTerminal(err) }, runs: 1},
		{name: "WithinTheBackoffNothingRuns", act: func() { c.now = c.now.Add(59 * time.Second) }, wantErr: driver.IsFailing, runs: 1},
		{name: "AfterItTheImportRunsAgain", act: func() { c.now = c.now.Add(time.Second) }, importing: true, runs: 2},
		{name: "TheSecondBackoffIsTwiceAsLong", act: func() { c.now = c.now.Add(time.Minute) }, wantErr: driver.IsFailing, runs: 2},
		{name: "AChangedImageIsImportedAtOnce", act: func() {
			img.SHA256 = "00"
			b.fail = &SchemeRefusedError{Scheme: "file"}
		}, importing: true, runs: 3},
		{name: "ARefusalIsTerminal", act: func() {}, wantErr: func(err error) bool { return driver.IsTerminal(err) && driver.IsFailing(err) }, runs: 3},
		{name: "ATerminalErrorOfTheBackend", act: func() {
			img.SHA256 = "01"
			b.fail = driver.Terminalf("storage pool is gone")
		}, importing: true, runs: 4},
		{name: "StaysTerminal", act: func() {}, wantErr: func(err error) bool { return driver.IsTerminal(err) && driver.IsFailing(err) }, runs: 4},
		{name: "AnImportThatSucceeds", act: func() {
			img.SHA256 = "02"
			b.fail = nil
		}, importing: true, runs: 5},
		{name: "AnImageGoneBeforeAnEnsureSawItIsImportedAgain", act: func() { b.set(img.UID, false) }, importing: true, runs: 6},
		{name: "APresentImageNeedsNoImport", act: func() {}, runs: 6},
		{name: "AnImageGoneLaterIsImportedAgain", act: func() { b.set(img.UID, false) }, importing: true, runs: 7},
	}
	for _, step := range steps {
		ok := t.Run(step.name, func(t *testing.T) {
			step.act()
			msg, err := s.Ensure(context.Background(), img, b.has(img.UID), b.run)
			switch {
			case step.wantErr != nil:
				require.Error(t, err)
				assert.True(t, step.wantErr(err), "got %v", err)
			case step.importing:
				require.NoError(t, err)
				assert.Contains(t, msg, "importing image ubuntu: ")
			default:
				require.NoError(t, err)
				assert.Empty(t, msg)
			}
			settle(t, s, img.UID)
			assert.Equal(t, step.runs, b.runs.Load(), "imports run")
		})
		if !ok {
			return
		}
	}
}

// TestImportsOutliveTheirEnsure: an import runs under the lifetime it was
// started with, and Wait waits for it once that ends.
func TestImportsOutliveTheirEnsure(t *testing.T) {
	s := New(Config{Dir: t.TempDir()})
	b := newBackend()
	b.gate = make(chan struct{})
	img := testImage("5d1c0e6a-0000-4000-8000-000000000a03")
	lifetime, cancel := context.WithCancel(context.Background())
	_, err := s.Ensure(lifetime, img, b.has(img.UID), b.run)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return b.runs.Load() == 1 }, 5*time.Second, 10*time.Millisecond)

	cancel()
	s.Wait()
	b.mu.Lock()
	defer b.mu.Unlock()
	assert.ErrorIs(t, b.ctx.Err(), context.Canceled, "the import ended with its lifetime")
}

// TestStatus lists images as Images reports them: present, importing,
// failed, and forgotten once pruned.
func TestStatus(t *testing.T) {
	c := &clock{now: time.Now()}
	s := New(Config{Dir: t.TempDir(), Now: c.Now})
	b := newBackend()
	imported, failed, running := testImage("a"), testImage("b"), testImage("c")
	failed.Name, running.Name = "debian", "fedora"

	_, err := s.Ensure(context.Background(), imported, b.has(imported.UID), b.run)
	require.NoError(t, err)
	settle(t, s, imported.UID)
	b.fail = errors.New("GET answered 404 Not Found")
	_, err = s.Ensure(context.Background(), failed, b.has(failed.UID), b.run)
	require.NoError(t, err)
	settle(t, s, failed.UID)
	b.gate, b.fail = make(chan struct{}), nil
	t.Cleanup(func() {
		close(b.gate)
		s.Wait()
	})
	_, err = s.Ensure(context.Background(), running, b.has(running.UID), b.run)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return b.runs.Load() == 3 }, 5*time.Second, 10*time.Millisecond)

	present := map[string]int64{imported.UID: 1 << 20, "found-after-a-restart": 2 << 20}
	assert.Equal(t, []driver.ImageStatus{
		{UID: "a", Name: "ubuntu", Phase: driver.ImagePhaseReady, SizeBytes: 1 << 20, ImportStarted: c.now, ImportFinished: c.now},
		{UID: "b", Name: "debian", Phase: driver.ImagePhaseFailed, Message: "GET answered 404 Not Found", ImportStarted: c.now, ImportFinished: c.now},
		{UID: "c", Name: "fedora", Phase: driver.ImagePhaseImporting, Message: "importing image fedora: 3 of 10 bytes"},
		{UID: "found-after-a-restart", Phase: driver.ImagePhaseReady, SizeBytes: 2 << 20},
	}, s.Status(present))

	s.Forget(imported.UID)
	delete(present, imported.UID)
	st := s.Status(present)
	require.Len(t, st, 3)
	assert.Equal(t, "b", st[0].UID, "a pruned image is not on the node")
}

func TestBackoff(t *testing.T) {
	s := New(Config{RetryBase: 5 * time.Second, RetryMax: time.Minute})
	cases := map[int]time.Duration{1: 5 * time.Second, 2: 10 * time.Second, 3: 20 * time.Second, 4: 40 * time.Second, 5: time.Minute, 50: time.Minute}
	for attempts, want := range cases {
		assert.Equal(t, want, s.backoff(attempts), "after %d failures", attempts)
	}
}

// TestDownloadVerifies: a download must match its checksum and pass
// inspection, or nothing of it is kept.
func TestDownloadVerifies(t *testing.T) {
	qcow2 := diskimagetest.QCOW2Header()
	backed := diskimagetest.QCOW2Header()
	backed[15] = 1 // an offset of a backing file's name
	sum := func(b []byte) string { h := sha256.Sum256(b); return hex.EncodeToString(h[:]) }
	cases := map[string]struct {
		data    []byte
		change  func(img *driver.Image)
		wantErr string
		refusal bool
	}{
		"AMatchingQcow2IsKept":    {data: qcow2, change: func(img *driver.Image) { img.SHA256 = sum(qcow2) }},
		"NoChecksumChecksNothing": {data: qcow2, change: func(*driver.Image) {}},
		"AnEmptyFormatIsQcow2":    {data: qcow2, change: func(img *driver.Image) { img.Format = "" }},
		"AChecksumMismatchIsNotKept": {
			data:    qcow2,
			change:  func(img *driver.Image) { img.SHA256 = sum([]byte("another image")) },
			wantErr: "failed its checksum: expected sha256 " + sum([]byte("another image")) + ", got " + sum(qcow2) + "; nothing was kept",
		},
		"AQcow2NamingABackingFileIsRefused": {
			data:    backed,
			change:  func(*driver.Image) {},
			wantErr: "cannot import image ubuntu: qcow2 image names a backing file: refused",
			refusal: true,
		},
		"ARawImageDeclaredQcow2IsRefused": {
			data:    []byte("not a qcow2 image at all"),
			change:  func(img *driver.Image) { img.Format = "" },
			wantErr: "cannot import image ubuntu: image declared qcow2 is not a qcow2 image (no qcow2 magic): refused",
			refusal: true,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			srv, _ := countingServer(t, "127.0.0.1:0", serveBytes(tc.data))
			dir := t.TempDir()
			s := New(Config{Dir: dir})
			img := &driver.Image{UID: "5d1c0e6a-0000-4000-8000-000000000a04", Name: "ubuntu", URL: srv.URL + "/disk.qcow2", Format: "qcow2", AllowedSources: loopback}
			tc.change(img)
			path, size, err := s.newJob("", 0).Download(context.Background(), img)
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				assert.Equal(t, tc.refusal, IsRefusal(err))
				assert.Empty(t, path)
				left, _ := filepath.Glob(filepath.Join(dir, "*"))
				assert.Empty(t, left, "nothing of a refused download is kept")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, int64(len(tc.data)), size)
			assert.Equal(t, dir, filepath.Dir(path))
			assert.Regexp(t, `^image_5d1c0e6a-0000-4000-8000-000000000a04-.*\.part$`, filepath.Base(path))
			got, err := os.ReadFile(path) //nolint:gosec // the test's download
			require.NoError(t, err)
			assert.Equal(t, tc.data, got)
		})
	}
}

// TestDownloadAnswers: what the server answers, short of the image.
func TestDownloadAnswers(t *testing.T) {
	srv, _ := countingServer(t, "127.0.0.1:0", func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "gone", http.StatusNotFound)
	})
	_, _, err := fetch(t, Config{}, srv.URL+"/disk.img", "127.0.0.0/8")
	require.ErrorContains(t, err, "cannot import image ubuntu: GET "+srv.URL+"/disk.img answered 404 Not Found")
	assert.False(t, IsRefusal(err), "the image may appear on the server")
}

func TestStaleDownloadsOfAKilledAgentAreRemovedAtStart(t *testing.T) {
	dir := t.TempDir()
	stale := filepath.Join(dir, "image_5d1c0e6a-0000-4000-8000-0000000000bb-123.part")
	other := filepath.Join(dir, "not-ours.txt")
	require.NoError(t, os.WriteFile(stale, []byte("half an image"), 0o600))
	require.NoError(t, os.WriteFile(other, []byte("keep"), 0o600))
	New(Config{Dir: dir})
	assert.NoFileExists(t, stale, "a killed agent's partial download goes")
	assert.FileExists(t, other, "nothing else in the directory is touched")
}

// TestOneNamespaceCannotHoldEveryDownloadSlot is an attack by a tenant that
// may create DiskImages and Volumes in its own namespace, against a real
// HTTP server the images come from:
//
//  1. mallory, in tenant-a, points three DiskImages at a server of hers
//     that answers slowly (here: not until the test lets it), and asks
//     one node for all three;
//  2. alice, in tenant-b, then asks the same node for an image of hers.
//
// Before the share, mallory's first two imports held both of the node's
// download slots for as long as her server kept them (up to the import
// timeout, an hour), and alice's import waited behind them. Now mallory's
// imports hold all but one slot, and alice's download starts at once.
func TestOneNamespaceCannotHoldEveryDownloadSlot(t *testing.T) {
	hold := make(chan struct{})
	requested := make(chan string, 8)
	srv, _ := countingServer(t, "127.0.0.1:0", func(w http.ResponseWriter, r *http.Request) {
		requested <- r.URL.Path
		select {
		case <-hold:
		case <-r.Context().Done():
			return
		}
		serveBytes(diskimagetest.QCOW2Header())(w, r)
	})
	lifetime, stop := context.WithCancel(context.Background())
	s := New(Config{Dir: t.TempDir(), Downloads: 2})
	t.Cleanup(func() { stop(); s.Wait() })
	b := newBackend()
	run := func(ctx context.Context, img *driver.Image, job *Job) error {
		path, _, err := job.Download(ctx, img)
		if err != nil {
			return err
		}
		_ = os.Remove(path)
		return b.run(ctx, img, job)
	}
	image := func(namespace, name string) *driver.Image {
		return &driver.Image{UID: namespace + "-" + name, Name: name, Namespace: namespace, URL: srv.URL + "/" + name, Format: "qcow2", AllowedSources: loopback}
	}
	ensure := func(img *driver.Image) string {
		msg, err := s.Ensure(lifetime, img, b.has(img.UID), run)
		require.NoError(t, err)
		return msg
	}
	// seen waits for the server to be asked for path, and fails on any
	// other download first.
	seen := func(path string) {
		t.Helper()
		select {
		case got := <-requested:
			require.Equal(t, path, got)
		case <-time.After(10 * time.Second):
			require.Failf(t, "no download started", "want %s", path)
		}
	}

	mallory := []*driver.Image{image("tenant-a", "m1"), image("tenant-a", "m2"), image("tenant-a", "m3")}
	ensure(mallory[0])
	seen("/m1")
	ensure(mallory[1])
	ensure(mallory[2])
	require.Eventually(t, func() bool { return ensure(mallory[1]) == "importing image m2: waiting for a download slot" }, 10*time.Second, 10*time.Millisecond,
		"tenant-a's second import waits while its first holds all it may")

	alice := image("tenant-b", "a1")
	ensure(alice)
	seen("/a1")
	assert.Equal(t, "importing image m3: waiting for a download slot", ensure(mallory[2]))

	close(hold)
	for _, img := range append(mallory, alice) {
		require.Eventually(t, func() bool { return ensure(img) == "" }, 10*time.Second, 10*time.Millisecond, "%s is imported once slots are freed", img.Name)
	}
}
