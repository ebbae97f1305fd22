package libvirt

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	golibvirt "github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"

	"github.com/virtfleet/virtfleet/agent/driver"
)

// A node keeps each image once, as the volume image_<uid> in the driver's
// pool. It is downloaded to a file in ImageDir (within the limits of
// fetch.go), verified, inspected (qcow2.go), and only then made a volume, so
// a failed, refused or interrupted download leaves nothing in the pool.

// imagePrefix starts the names of image volumes; disks are named
// <namespace>_<name> and Kubernetes names have no "_", so they never clash.
const imagePrefix = "image_"

func imageVolume(uid string) string { return imagePrefix + uid }

// Defaults of the image store.
const (
	importRetryBase = 5 * time.Second
	importRetryMax  = 5 * time.Minute
	// defaultPruneEvery is how often images are pruned unless configured.
	defaultPruneEvery = time.Minute
)

// images is the driver's image store: running and failed imports, and when
// each present image was last seen unused.
type images struct {
	// dir holds downloads until they are verified.
	dir string
	// maxBytes bounds the size of one download.
	maxBytes int64
	// timeout bounds the duration of one download.
	timeout time.Duration
	// slots holds a token per download running; its capacity is how many
	// may run at once.
	slots chan struct{}
	// retryBase and retryMax bound the backoff between imports of an image
	// that failed.
	retryBase, retryMax time.Duration
	// pruneEvery is the interval of the prune loop.
	pruneEvery time.Duration

	// inUse is read-held from an image being found present until the disks
	// made from it exist, and write-held while pruning, so an image is never
	// pruned between the two.
	inUse sync.RWMutex

	mu          sync.Mutex
	jobs        map[string]*importJob // by image uid
	pruneAfter  map[string]time.Duration
	unusedSince map[string]time.Time
	// names are the images' names as Ensure last gave them, for Images.
	names map[string]string
	// imported are the finished jobs of the images imported since the
	// driver started, kept after Ensure drops the job until the image is
	// pruned: Images tells when each import ran.
	imported map[string]*importJob
}

func newImages(cfg Config) *images {
	dir := cfg.ImageDir
	if dir == "" {
		dir = os.TempDir()
	} else {
		removeStaleDownloads(dir)
	}
	return &images{
		dir:         dir,
		maxBytes:    orDefault(cfg.ImageMaxBytes, DefaultImageMaxBytes),
		timeout:     orDefault(cfg.ImageDownloadTimeout, DefaultImageDownloadTimeout),
		slots:       make(chan struct{}, orDefault(cfg.ImageDownloads, DefaultImageDownloads)),
		retryBase:   importRetryBase,
		retryMax:    importRetryMax,
		pruneEvery:  cmp.Or(cfg.ImagePruneInterval, defaultPruneEvery),
		jobs:        map[string]*importJob{},
		pruneAfter:  map[string]time.Duration{},
		unusedSince: map[string]time.Time{},
		names:       map[string]string{},
		imported:    map[string]*importJob{},
	}
}

// orDefault is v, or def when v is not positive.
func orDefault[T int | int64 | time.Duration](v, def T) T {
	if v <= 0 {
		return def
	}
	return v
}

// removeStaleDownloads deletes the partial downloads a killed agent left in
// its own download directory; a running import always starts a new file.
func removeStaleDownloads(dir string) {
	stale, _ := filepath.Glob(filepath.Join(dir, imagePrefix+"*.part"))
	for _, f := range stale {
		_ = os.Remove(f)
	}
}

// importJob is one attempt at importing an image; every Ensure that needs the
// image while it runs waits on the same job.
type importJob struct {
	// input is what the job imports (importInput); a failed job is tried
	// again at once when the image's source or policy changed.
	input string
	done  chan struct{}
	// queued is set while the job waits for a download slot.
	queued atomic.Bool
	read   atomic.Int64
	total  atomic.Int64 // -1 while unknown
	// started is when the import began; err and finished are set, under
	// images.mu, before done is closed.
	started  time.Time
	err      error
	finished time.Time
	// attempts counts consecutive failed imports, for the backoff.
	attempts int
}

func (j *importJob) running() bool {
	select {
	case <-j.done:
		return false
	default:
		return true
	}
}

func (j *importJob) progress(img *driver.Image) string {
	if j.queued.Load() {
		return fmt.Sprintf("importing image %s: waiting for a download slot", img.Name)
	}
	total := "unknown"
	if t := j.total.Load(); t >= 0 {
		total = fmt.Sprint(t)
	}
	return fmt.Sprintf("importing image %s: %d of %s bytes", img.Name, j.read.Load(), total)
}

// importInput is what of img an import depends on: a job for another input
// says nothing about this one.
func importInput(img *driver.Image) string {
	return fmt.Sprintf("%q %q %q %q %v", img.URL, img.SourceVolume, img.SHA256, img.Format, img.AllowedSources)
}

// acquire waits for a download slot, marking job queued meanwhile, and
// returns the function that frees it.
func (s *images) acquire(ctx context.Context, job *importJob) (release func(), err error) {
	release = func() { <-s.slots }
	select {
	case s.slots <- struct{}{}:
		return release, nil
	default:
	}
	job.queued.Store(true)
	defer job.queued.Store(false)
	select {
	case s.slots <- struct{}{}:
		return release, nil
	case <-ctx.Done():
		return nil, errors.Wrap(ctx.Err(), "stopped waiting for a download slot")
	}
}

// backoff is how long to wait after the attempts-th consecutive failure.
func (s *images) backoff(attempts int) time.Duration {
	b := s.retryBase
	for i := 1; i < attempts && b < s.retryMax; i++ {
		b *= 2
	}
	return min(b, s.retryMax)
}

// prepareImages makes sure the images of m's missing disks are on the node.
// It returns a progress message while imports run, and a Failing error when
// one failed. The caller holds images.inUse for reading.
func (d *Driver) prepareImages(api API, m driver.Machine) (string, error) {
	var waiting []string
	for _, disk := range m.Disks {
		if disk.Image == nil {
			continue
		}
		exists, err := hasVolume(api, cmp.Or(disk.Pool, d.pool), disk.Name)
		if err != nil {
			return "", err
		}
		if exists {
			continue
		}
		if d.inSharedPool(disk.Pool) {
			// It would be a copy of the image, made by the first node
			// to use it; one left half-copied by a node that died
			// would be found by the next and booted as it is.
			return "", driver.Terminalf("volume %s in shared pool %s cannot be made from an image yet: make it without one, or in the node's own pool", disk.Name, disk.Pool)
		}
		msg, err := d.ensureImage(api, disk.Image)
		if err != nil {
			return "", err
		}
		if msg != "" {
			waiting = append(waiting, msg)
		}
	}
	return strings.Join(waiting, "; "), nil
}

// ensureImage returns "" when img is on the node, starts or joins its import
// otherwise and returns its progress, or returns the last import's error
// while the backoff after it lasts.
func (d *Driver) ensureImage(api API, img *driver.Image) (string, error) {
	s := d.images
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pruneAfter[img.UID] = img.PruneAfter
	s.names[img.UID] = img.Name
	present, err := d.hasImage(api, img)
	if err != nil {
		return "", err
	}
	job := s.jobs[img.UID]
	if present && (job == nil || !job.running()) {
		delete(s.jobs, img.UID)
		return "", nil
	}
	switch {
	case job == nil:
		job = d.startImport(img, 0)
	case job.running():
	case job.input != importInput(img):
		// The image changed since it failed (an administrator allowed its
		// source, say): its backoff is not this image's.
		job = d.startImport(img, 0)
	case job.err == nil:
		// Imported, then pruned or deleted behind our back: import again.
		job = d.startImport(img, 0)
	case d.now().Before(job.finished.Add(s.backoff(job.attempts))):
		return "", job.err
	default:
		job = d.startImport(img, job.attempts)
	}
	return job.progress(img), nil
}

// startImport runs an import in the background, bound to the driver's
// lifetime rather than to the Ensure that started it. The caller holds
// images.mu.
func (d *Driver) startImport(img *driver.Image, failedBefore int) *importJob {
	job := &importJob{input: importInput(img), done: make(chan struct{}), attempts: failedBefore, started: d.now()}
	job.total.Store(-1)
	d.images.jobs[img.UID] = job
	im := *img
	d.loops.Add(1)
	go func() {
		defer d.loops.Done()
		err := d.importImage(d.ctx, &im, job)
		d.images.mu.Lock()
		defer d.images.mu.Unlock()
		job.err, job.finished = driver.Failing(err), d.now()
		if err != nil {
			job.attempts++
		} else {
			d.images.imported[im.UID] = job
		}
		close(job.done)
	}()
	return job
}

// importImage downloads img, verifies and inspects it and stores it as its
// volume, or clones it from its source volume (clone.go). A download the
// node refuses by policy (refusal) is Terminal: only a changed image or
// grant can mend it.
func (d *Driver) importImage(ctx context.Context, img *driver.Image, job *importJob) error {
	if img.SourceVolume != "" {
		return d.cloneImage(img, job)
	}
	path, size, err := d.images.download(ctx, img, job)
	if path != "" {
		defer os.Remove(path) //nolint:errcheck // a leftover temp file is harmless
	}
	if err == nil {
		if err = inspectImage(path, cmp.Or(img.Format, defaultFormat)); err != nil {
			err = errors.Errorf("cannot import image %s: %w", img.Name, err)
		}
	}
	if isRefusal(err) {
		return driver.Terminal(err)
	}
	if err != nil {
		return err
	}
	api, _, err := d.api()
	if err != nil {
		return err
	}
	return d.storeImage(api, img, path, size)
}

// countingWriter counts the bytes written through it, for progress.
type countingWriter struct{ n *atomic.Int64 }

func (w countingWriter) Write(p []byte) (int, error) {
	w.n.Add(int64(len(p)))
	return len(p), nil
}

// download streams img.URL into a temporary file, hashing as it goes, and
// returns the file's path once it passed the checksum. It waits for a
// download slot first, then connects only where fetchClient allows and
// stops at the size and time limits. On error the path names whatever must
// be removed, or is empty; an error the node's policy caused is a refusal.
func (s *images) download(ctx context.Context, img *driver.Image, job *importJob) (string, int64, error) {
	u, err := url.Parse(img.URL)
	if err != nil {
		return "", 0, errors.Errorf("cannot import image %s: bad URL %q: %v", img.Name, img.URL, err)
	}
	if err := checkScheme(u); err != nil {
		return "", 0, errors.Errorf("cannot import image %s: %w", img.Name, err)
	}
	release, err := s.acquire(ctx, job)
	if err != nil {
		return "", 0, errors.Wrapf(err, "cannot import image %s", img.Name)
	}
	defer release()
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()

	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return "", 0, errors.Wrap(err, "cannot create the image download directory")
	}
	f, err := os.CreateTemp(s.dir, imageVolume(img.UID)+"-*.part")
	if err != nil {
		return "", 0, errors.Wrap(err, "cannot create the image download file")
	}
	defer f.Close() //nolint:errcheck // closed explicitly below on success
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, img.URL, nil)
	if err != nil {
		return f.Name(), 0, errors.Errorf("cannot import image %s: bad URL %q: %v", img.Name, img.URL, err)
	}
	client := fetchClient(img.AllowedSources)
	defer client.CloseIdleConnections()
	resp, err := client.Do(req)
	if r := refusalOf(err); r != nil {
		// Only the refusal: the URL of a redirect is the server's to tell.
		return f.Name(), 0, errors.Errorf("cannot import image %s: %w", img.Name, r)
	}
	if err != nil {
		return f.Name(), 0, errors.Errorf("cannot import image %s: %v", img.Name, s.timedOut(ctx, err))
	}
	defer resp.Body.Close() //nolint:errcheck // read-only body
	if resp.StatusCode != http.StatusOK {
		return f.Name(), 0, errors.Errorf("cannot import image %s: GET %s answered %s", img.Name, img.URL, resp.Status)
	}
	if resp.ContentLength > s.maxBytes {
		return f.Name(), 0, errors.Errorf("cannot import image %s: %w", img.Name, &TooLargeError{Host: u.Hostname(), Size: resp.ContentLength, Max: s.maxBytes})
	}
	job.total.Store(resp.ContentLength)
	h := sha256.New()
	// One byte past the limit tells a body at the limit from one over it.
	n, err := io.Copy(io.MultiWriter(f, h, countingWriter{&job.read}), io.LimitReader(resp.Body, s.maxBytes+1))
	if err != nil {
		return f.Name(), 0, errors.Errorf("cannot import image %s: download from %s broke off after %d bytes: %v", img.Name, img.URL, n, s.timedOut(ctx, err))
	}
	if n > s.maxBytes {
		return f.Name(), 0, errors.Errorf("cannot import image %s: %w", img.Name, &TooLargeError{Host: u.Hostname(), Size: -1, Max: s.maxBytes})
	}
	if err := f.Close(); err != nil {
		return f.Name(), 0, errors.Wrap(err, "cannot write the image download file")
	}
	if got := hex.EncodeToString(h.Sum(nil)); img.SHA256 != "" && got != img.SHA256 {
		return f.Name(), 0, errors.Errorf("image %s from %s failed its checksum: expected sha256 %s, got %s; nothing was kept", img.Name, img.URL, img.SHA256, got)
	}
	return f.Name(), n, nil
}

// timedOut names the download's time limit when ctx ran out of it, and
// returns err otherwise.
func (s *images) timedOut(ctx context.Context, err error) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return errors.Errorf("the download did not finish within this node's limit of %s", s.timeout)
	}
	return err
}

// storeImage makes the verified file at path the image's volume. libvirt's
// test driver cannot upload, so there the volume of the right size stands
// for the file. A failed upload deletes the volume again.
func (d *Driver) storeImage(api API, img *driver.Image, path string, size int64) error {
	p, err := api.StoragePoolLookupByName(d.pool)
	if err != nil {
		return errors.Wrapf(err, "cannot look up storage pool %s", d.pool)
	}
	_, capacity, _, available, err := api.StoragePoolGetInfo(p)
	if err != nil {
		return errors.Wrapf(err, "cannot read storage pool %s", d.pool)
	}
	if uint64(size) > available {
		return errors.Errorf("cannot import image %s: it needs %d bytes but storage pool %q on node %s has %d of %d bytes free", img.Name, size, d.pool, d.node, available, capacity)
	}
	x, err := (&libvirtxml.StorageVolume{
		Name:     imageVolume(img.UID),
		Capacity: &libvirtxml.StorageVolumeSize{Value: uint64(size), Unit: "B"},
		Target:   &libvirtxml.StorageVolumeTarget{Format: &libvirtxml.StorageVolumeTargetFormat{Type: cmp.Or(img.Format, defaultFormat)}},
	}).Marshal()
	if err != nil {
		return errors.Wrap(err, "cannot marshal volume XML")
	}
	v, err := api.StorageVolCreateXML(p, x, 0)
	if err != nil {
		return errors.Wrapf(err, "cannot create the volume of image %s", img.Name)
	}
	if d.testDriver {
		return nil
	}
	f, err := os.Open(path) //nolint:gosec // our own download file
	if err != nil {
		_ = api.StorageVolDelete(v, 0)
		return errors.Wrap(err, "cannot open the image download file")
	}
	defer f.Close() //nolint:errcheck // read-only
	if err := api.StorageVolUpload(v, f, 0, uint64(size), 0); err != nil {
		_ = api.StorageVolDelete(v, 0)
		return errors.Wrapf(err, "cannot upload image %s", img.Name)
	}
	return nil
}

// ensureImageDisk creates a missing disk from its image: a qcow2 overlay
// backed by the image when both live in the driver's pool and the image is
// qcow2, a full copy otherwise (a raw image, or a disk in another pool, where
// pruning could not see that the disk depends on the image). It says
// whether it made the disk.
func (d *Driver) ensureImageDisk(api API, disk driver.Disk) (bool, error) {
	pool := cmp.Or(disk.Pool, d.pool)
	p, err := api.StoragePoolLookupByName(pool)
	if isCode(err, golibvirt.ErrNoStoragePool) {
		return false, driver.Terminalf("storage pool %q does not exist on this node", pool)
	}
	if err != nil {
		return false, errors.Wrapf(err, "cannot look up storage pool %s", pool)
	}
	if exists, err := hasVolume(api, pool, disk.Name); err != nil || exists {
		return false, err
	}
	ip, err := api.StoragePoolLookupByName(d.pool)
	if err != nil {
		return false, errors.Wrapf(err, "cannot look up storage pool %s", d.pool)
	}
	iv, err := api.StorageVolLookupByName(ip, imageVolume(disk.Image.UID))
	if err != nil {
		return false, errors.Wrapf(err, "cannot find image %s on the node", disk.Image.Name)
	}
	_, imageSize, _, err := api.StorageVolGetInfo(iv)
	if err != nil {
		return false, errors.Wrapf(err, "cannot read image %s", disk.Image.Name)
	}
	// A disk smaller than its image could not hold it.
	size := max(disk.SizeBytes, int64(imageSize))
	v := &libvirtxml.StorageVolume{
		Name:     disk.Name,
		Capacity: &libvirtxml.StorageVolumeSize{Value: uint64(size), Unit: "B"},
		Target:   &libvirtxml.StorageVolumeTarget{Format: &libvirtxml.StorageVolumeTargetFormat{Type: cmp.Or(disk.Format, defaultFormat)}},
	}
	if cmp.Or(disk.Image.Format, defaultFormat) != "qcow2" || pool != d.pool {
		_, err := createVolumeFrom(api, p, v, &iv)
		return err == nil, err
	}
	path, err := api.StorageVolGetPath(iv)
	if err != nil {
		return false, errors.Wrapf(err, "cannot read the path of image %s", disk.Image.Name)
	}
	v.Target.Format.Type = "qcow2"
	v.BackingStore = &libvirtxml.StorageVolumeBackingStore{Path: path, Format: &libvirtxml.StorageVolumeTargetFormat{Type: "qcow2"}}
	_, err = createVolumeFrom(api, p, v, nil)
	return err == nil, err
}

// PruneImages deletes the images on the node that no volume in the driver's
// pool is backed by and that have been unused for their PruneAfter (the
// last one an Ensure asked for, else driver.DefaultPruneAfter). It returns
// the uids of the images it deleted. When an image became unused is kept in
// memory only: after a restart the clock starts again, which delays pruning
// but never prunes early.
func (d *Driver) PruneImages(context.Context) ([]string, error) {
	s := d.images
	s.inUse.Lock()
	defer s.inUse.Unlock()
	api, vols, err := d.poolVolumes()
	if err != nil {
		return nil, err
	}
	backing := map[string]bool{}
	present := map[string]golibvirt.StorageVol{}
	for _, v := range vols {
		if uid, ok := strings.CutPrefix(v.Name, imagePrefix); ok {
			present[uid] = v
			continue
		}
		x, err := api.StorageVolGetXMLDesc(v, 0)
		if isCode(err, golibvirt.ErrNoStorageVol) {
			continue
		}
		if err != nil {
			return nil, errors.Wrapf(err, "cannot read volume %s", v.Name)
		}
		var def libvirtxml.StorageVolume
		if err := def.Unmarshal(x); err != nil {
			return nil, errors.Wrapf(err, "cannot parse volume %s", v.Name)
		}
		if def.BackingStore != nil {
			backing[def.BackingStore.Path] = true
		}
	}

	now := d.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	for uid := range s.unusedSince {
		if _, ok := present[uid]; !ok {
			delete(s.unusedSince, uid)
		}
	}
	var pruned []string
	for uid, v := range present {
		path, err := api.StorageVolGetPath(v)
		if err != nil {
			return pruned, errors.Wrapf(err, "cannot read the path of volume %s", v.Name)
		}
		if backing[path] {
			delete(s.unusedSince, uid)
			continue
		}
		since, ok := s.unusedSince[uid]
		if !ok {
			s.unusedSince[uid], since = now, now
		}
		after := s.pruneAfter[uid]
		if after <= 0 {
			after = driver.DefaultPruneAfter
		}
		if now.Sub(since) < after {
			continue
		}
		if err := api.StorageVolDelete(v, 0); err != nil && !isCode(err, golibvirt.ErrNoStorageVol) {
			return pruned, errors.Wrapf(err, "cannot prune image volume %s", v.Name)
		}
		delete(s.unusedSince, uid)
		delete(s.imported, uid)
		pruned = append(pruned, uid)
	}
	return pruned, nil
}

// poolVolumes lists the volumes of the driver's pool, with the connection
// it used.
func (d *Driver) poolVolumes() (API, []golibvirt.StorageVol, error) {
	api, _, err := d.api()
	if err != nil {
		return nil, nil, err
	}
	p, err := api.StoragePoolLookupByName(d.pool)
	if err != nil {
		return nil, nil, errors.Wrapf(err, "cannot look up storage pool %s", d.pool)
	}
	vols, _, err := api.StoragePoolListAllVolumes(p, 1, 0)
	if err != nil {
		return nil, nil, errors.Wrapf(err, "cannot list volumes of storage pool %s", d.pool)
	}
	return api, vols, nil
}

// Images implements driver.Driver: the image volumes in the driver's pool,
// and the imports running or failed. An image volume being uploaded is
// still Importing; a failed import is reported until the next attempt
// starts or the image arrives.
func (d *Driver) Images(context.Context) ([]driver.ImageStatus, error) {
	api, vols, err := d.poolVolumes()
	if err != nil {
		return nil, err
	}
	present := map[string]int64{}
	for _, v := range vols {
		uid, ok := strings.CutPrefix(v.Name, imagePrefix)
		if !ok {
			continue
		}
		_, capacity, allocation, err := api.StorageVolGetInfo(v)
		if isCode(err, golibvirt.ErrNoStorageVol) {
			continue // pruned since the listing
		}
		if err != nil {
			return nil, errors.Wrapf(err, "cannot read image volume %s", v.Name)
		}
		// The bytes the image takes on the node; a backend that does not
		// account for allocation (libvirt's test driver) has only capacity.
		present[uid] = int64(cmp.Or(allocation, capacity)) //nolint:gosec // volume sizes fit in int64
	}

	s := d.images
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]driver.ImageStatus, 0, len(present)+len(s.jobs))
	for uid, size := range present {
		st := driver.ImageStatus{UID: uid, Name: s.names[uid], Phase: driver.ImagePhaseReady, SizeBytes: size}
		if job := s.jobs[uid]; job != nil && job.running() {
			st.Phase, st.SizeBytes, st.Message = driver.ImagePhaseImporting, 0, job.progress(&driver.Image{Name: s.names[uid]})
		} else if job := s.imported[uid]; job != nil {
			st.ImportStarted, st.ImportFinished = job.started, job.finished
		}
		out = append(out, st)
	}
	for uid, job := range s.jobs {
		if _, ok := present[uid]; ok {
			continue
		}
		st := driver.ImageStatus{UID: uid, Name: s.names[uid]}
		switch {
		case job.running():
			st.Phase, st.Message = driver.ImagePhaseImporting, job.progress(&driver.Image{Name: s.names[uid]})
		case job.err != nil:
			st.Phase, st.Message = driver.ImagePhaseFailed, job.err.Error()
			st.ImportStarted, st.ImportFinished = job.started, job.finished
		default:
			continue // imported, then pruned: not on the node
		}
		out = append(out, st)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].UID < out[j].UID })
	return out, nil
}

// hasVolume reports whether pool holds a volume called name.
func hasVolume(api API, pool, name string) (bool, error) {
	p, err := api.StoragePoolLookupByName(pool)
	if isCode(err, golibvirt.ErrNoStoragePool) {
		return false, driver.Terminalf("storage pool %q does not exist on this node", pool)
	}
	if err != nil {
		return false, errors.Wrapf(err, "cannot look up storage pool %s", pool)
	}
	_, err = api.StorageVolLookupByName(p, name)
	switch {
	case err == nil:
		return true, nil
	case isCode(err, golibvirt.ErrNoStorageVol):
		return false, nil
	default:
		return false, errors.Wrapf(err, "cannot look up volume %s", name)
	}
}
