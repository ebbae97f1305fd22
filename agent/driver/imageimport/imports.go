// Package imageimport brings the disk images a node keeps (driver.Image)
// onto the node, for any driver: the policy of what a download may connect
// to (fetch.go), the inspection that refuses an image naming files of the
// node (qcow2.go), the store of import jobs (Imports: one import of an
// image however many guests need it, retried with backoff, reported for
// Images), and the clock that tells when an unused image goes
// (PruneClock). What a verified image becomes on the node — a libvirt
// volume, a Glance image — is the driver's.
package imageimport

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
	"sync"
	"sync/atomic"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/agent/driver"
)

// Defaults of Config.
const (
	DefaultMaxBytes  int64 = 64 << 30
	DefaultTimeout         = time.Hour
	DefaultDownloads       = 2
	DefaultRetryBase       = 5 * time.Second
	DefaultRetryMax        = 5 * time.Minute
)

// defaultFormat is an image's format when it names none (driver.Image).
const defaultFormat = "qcow2"

// partPrefix starts the names of download files, image_<uid>-<random>.part,
// so the partial downloads of a killed agent are told from anything else
// in Dir and removed at the next start.
const partPrefix = "image_"

// Config configures an import store.
type Config struct {
	// Dir holds downloads until they are verified and the driver has
	// taken them. It belongs to this store alone: New removes the partial
	// downloads an earlier agent left behind when it was killed. Empty
	// means the system's temporary directory, which is not cleaned.
	Dir string
	// MaxBytes is the largest download accepted; a larger one is refused
	// as soon as its size is known. Zero or less means DefaultMaxBytes.
	MaxBytes int64
	// Timeout bounds one download, from its first connection to its last
	// byte; zero or less means DefaultTimeout.
	Timeout time.Duration
	// Downloads is how many downloads run at once; the others wait for a
	// slot. Zero or less means DefaultDownloads. The images of one
	// namespace (driver.Image.Namespace) hold all but one of them at
	// most, and one where there is only one.
	Downloads int
	// RetryBase is the wait after an image's first failed import, doubled
	// after each further one up to RetryMax; zero or less means
	// DefaultRetryBase and DefaultRetryMax.
	RetryBase, RetryMax time.Duration
	// Now is the store's clock; nil means time.Now.
	Now func() time.Time
}

// Imports is a driver's store of image imports: those running, the last
// failed one of each image, and the last that succeeded, for Status.
type Imports struct {
	cfg Config
	// slots are the downloads running, in all and by namespace.
	slots *downloadSlots
	// running counts the imports running in the background, for Wait.
	running sync.WaitGroup

	mu   sync.Mutex
	jobs map[string]*Job // by image uid
	// names are the images' names as Ensure last gave them, for Status.
	names map[string]string
	// imported are the finished jobs of the images imported since the
	// store was made, kept after Ensure drops the job until the image is
	// forgotten: Status tells when each import ran.
	imported map[string]*Job
}

// New makes the store cfg configures, and removes the partial downloads
// left in cfg.Dir.
func New(cfg Config) *Imports {
	if cfg.Dir == "" {
		cfg.Dir = os.TempDir()
	} else {
		removeStaleDownloads(cfg.Dir)
	}
	cfg.MaxBytes = orDefault(cfg.MaxBytes, DefaultMaxBytes)
	cfg.Timeout = orDefault(cfg.Timeout, DefaultTimeout)
	cfg.Downloads = orDefault(cfg.Downloads, DefaultDownloads)
	cfg.RetryBase = orDefault(cfg.RetryBase, DefaultRetryBase)
	cfg.RetryMax = orDefault(cfg.RetryMax, DefaultRetryMax)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Imports{
		cfg:      cfg,
		slots:    newDownloadSlots(cfg.Downloads),
		jobs:     map[string]*Job{},
		names:    map[string]string{},
		imported: map[string]*Job{},
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
	stale, _ := filepath.Glob(filepath.Join(dir, partPrefix+"*.part"))
	for _, f := range stale {
		_ = os.Remove(f)
	}
}

// Dir is the directory downloads are made in.
func (s *Imports) Dir() string { return s.cfg.Dir }

// Wait waits for the imports running in the background; they end soon
// after the lifetime context Ensure started them under is canceled.
func (s *Imports) Wait() { s.running.Wait() }

// Job is one attempt at importing an image; every Ensure that needs the
// image while it runs shares it.
type Job struct {
	s *Imports
	// input is what the job imports (InputOf); a failed job is tried
	// again at once when the image's source or policy changed.
	input string
	done  chan struct{}
	// queued is set while the job waits for a download slot.
	queued atomic.Bool
	read   atomic.Int64
	total  atomic.Int64 // -1 while unknown
	// started is when the import began; err and finished are set, under
	// Imports.mu, before done is closed.
	started  time.Time
	err      error
	finished time.Time
	// attempts counts consecutive failed imports, for the backoff.
	attempts int
}

func (s *Imports) newJob(input string, failedBefore int) *Job {
	j := &Job{s: s, input: input, done: make(chan struct{}), attempts: failedBefore, started: s.cfg.Now()}
	j.total.Store(-1)
	return j
}

// SetProgress tells how far an import that does not Download got: read
// bytes of total, total -1 while unknown. Download keeps them itself.
func (j *Job) SetProgress(read, total int64) {
	j.read.Store(read)
	j.total.Store(total)
}

func (j *Job) running() bool {
	select {
	case <-j.done:
		return false
	default:
		return true
	}
}

// progress is the message of the running job importing the image called
// name.
func (j *Job) progress(name string) string {
	if j.queued.Load() {
		return fmt.Sprintf("importing image %s: waiting for a download slot", name)
	}
	total := "unknown"
	if t := j.total.Load(); t >= 0 {
		total = fmt.Sprint(t)
	}
	return fmt.Sprintf("importing image %s: %d of %s bytes", name, j.read.Load(), total)
}

// InputOf is what of img an import depends on: a job for another input
// says nothing about this one. A driver that vouches for an image once
// it is imported (or verified) keys what it vouched for with it too. Of a
// backup it is where the backup is and which disk of it, never the
// location's credentials.
func InputOf(img *driver.Image) string {
	in := fmt.Sprintf("%q %q %q %q %v", img.URL, img.SourceVolume, img.SHA256, img.Format, img.AllowedSources)
	if img.SourceSnapshot != "" {
		in += fmt.Sprintf(" snapshot %q", img.SourceSnapshot)
	}
	if b := img.Backup; b != nil {
		l := b.Location
		in += fmt.Sprintf(" backup %q %q %q %q/%q/%q", l.Endpoint, l.Bucket, l.Prefix, b.Namespace, b.ID, b.Disk)
	}
	return in
}

// Ensure returns "" when img is on the node, as present says; otherwise it
// starts or joins img's import and returns its progress, or returns the
// last import's error while the backoff after it lasts. A failed import is
// tried again at once when img changed since (an administrator allowed its
// source, say), and an image imported and then gone from the node is
// imported again.
//
// present is asked only while no import of img runs, with the store
// locked, so an import finishing meanwhile is never taken for an image
// that vanished; it should be quick.
// run imports img: it Downloads it, say, and stores the file where the
// driver keeps images. It runs in the background on a copy of img, under
// lifetime — the driver's own context, canceled when it closes, not that
// of the call that started the import, which returns long before it ends.
// An error of run is Failing: shown to the user, and retried after the
// backoff. A refusal (IsRefusal) is Terminal as well, as is any error run
// made Terminal: the caller need not retry before img changes. A Held
// image the node lacks is Terminal at once: nothing is left to import.
func (s *Imports) Ensure(lifetime context.Context, img *driver.Image, present func() (bool, error), run func(ctx context.Context, img *driver.Image, job *Job) error) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.names[img.UID] = img.Name
	job := s.jobs[img.UID]
	if job == nil || !job.running() {
		ok, err := present()
		if err != nil {
			return "", err
		}
		if ok {
			delete(s.jobs, img.UID)
			return "", nil
		}
		if img.Held {
			// A disk made empty would boot as nothing, or be a guest's
			// data disk without the data: fail it, naming what is gone.
			return "", driver.Terminalf("image %s is not on this node, and nothing is left to make it of: its source, the volume or snapshot it copies, is gone; only a node that holds the image can make a disk of it", img.Name)
		}
	}
	switch {
	case job == nil:
		job = s.start(lifetime, img, 0, run)
	case job.running():
	case job.input != InputOf(img):
		// The image changed since it failed: its backoff is not this
		// image's.
		job = s.start(lifetime, img, 0, run)
	case job.err == nil:
		// Imported, then pruned or deleted behind our back: import again.
		job = s.start(lifetime, img, 0, run)
	case s.cfg.Now().Before(job.finished.Add(s.backoff(job.attempts))):
		return "", job.err
	default:
		job = s.start(lifetime, img, job.attempts, run)
	}
	return job.progress(img.Name), nil
}

// start runs an import of img in the background under lifetime. The caller
// holds s.mu.
func (s *Imports) start(lifetime context.Context, img *driver.Image, failedBefore int, run func(context.Context, *driver.Image, *Job) error) *Job {
	job := s.newJob(InputOf(img), failedBefore)
	s.jobs[img.UID] = job
	im := *img
	s.running.Add(1)
	go func() {
		defer s.running.Done()
		err := outcome(run(lifetime, &im, job))
		s.mu.Lock()
		defer s.mu.Unlock()
		job.err, job.finished = err, s.cfg.Now()
		if err != nil {
			job.attempts++
		} else {
			s.imported[im.UID] = job
		}
		close(job.done)
	}()
	return job
}

// outcome is the error Ensure reports for err, an import's: Failing, and
// Terminal as well when it is a refusal, which only a changed image or
// grant can mend.
func outcome(err error) error {
	if IsRefusal(err) && !driver.IsTerminal(err) {
		err = driver.Terminal(err)
	}
	return driver.Failing(err)
}

// backoff is how long to wait after the attempts-th consecutive failure.
func (s *Imports) backoff(attempts int) time.Duration {
	b := s.cfg.RetryBase
	for i := 1; i < attempts && b < s.cfg.RetryMax; i++ {
		b *= 2
	}
	return min(b, s.cfg.RetryMax)
}

// Status is what the driver's Images reports, given present, the images on
// the node by uid with the bytes each takes there. A present image is
// Ready, with when this store imported it if it did, or Importing while an
// import into it runs; an absent one is Importing while its import runs,
// Failed with the reason while its last import failed, and not listed
// otherwise. It is sorted by uid.
func (s *Imports) Status(present map[string]int64) []driver.ImageStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]driver.ImageStatus, 0, len(present)+len(s.jobs))
	for uid, size := range present {
		st := driver.ImageStatus{UID: uid, Name: s.names[uid], Phase: driver.ImagePhaseReady, SizeBytes: size}
		if job := s.jobs[uid]; job != nil && job.running() {
			st.Phase, st.SizeBytes, st.Message = driver.ImagePhaseImporting, 0, job.progress(s.names[uid])
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
			st.Phase, st.Message = driver.ImagePhaseImporting, job.progress(s.names[uid])
		case job.err != nil:
			st.Phase, st.Message = driver.ImagePhaseFailed, job.err.Error()
			st.ImportStarted, st.ImportFinished = job.started, job.finished
		default:
			continue // imported, then pruned: not on the node
		}
		out = append(out, st)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].UID < out[j].UID })
	return out
}

// Forget drops what the store knows of the last import of image uid, once
// the driver pruned the image: it is no longer on the node.
func (s *Imports) Forget(uid string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.imported, uid)
}

// downloadSlots share a node's downloads out among namespaces. They are
// bounded here, where the downloads run, not where the hub publishes
// intents: only the node knows which of its imports still wait, and an
// image several namespaces' disks need is one import here, whichever
// intents name it. A namespace holds all but one slot at most, so that
// however many images one tenant asks a node for, another tenant's import
// finds a slot no later than one of the first tenant's imports ends.
type downloadSlots struct {
	mu           sync.Mutex
	limit        int
	perNamespace int
	running      int
	namespaces   map[string]int
	// freed is closed, and made anew, whenever a slot is freed, so
	// every waiter looks again.
	freed chan struct{}
}

func newDownloadSlots(limit int) *downloadSlots {
	return &downloadSlots{limit: limit, perNamespace: max(1, limit-1), namespaces: map[string]int{}, freed: make(chan struct{})}
}

// take holds a slot for namespace if one is free to it, or returns what is
// closed when one is freed.
func (d *downloadSlots) take(namespace string) (freed <-chan struct{}, ok bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.running >= d.limit || d.namespaces[namespace] >= d.perNamespace {
		return d.freed, false
	}
	d.running++
	d.namespaces[namespace]++
	return nil, true
}

func (d *downloadSlots) release(namespace string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.running--
	if d.namespaces[namespace]--; d.namespaces[namespace] == 0 {
		delete(d.namespaces, namespace)
	}
	close(d.freed)
	d.freed = make(chan struct{})
}

// acquire waits for a download slot free to namespace, marking job queued
// meanwhile, and returns the function that frees it.
func (s *Imports) acquire(ctx context.Context, job *Job, namespace string) (release func(), err error) {
	var once sync.Once
	release = func() { once.Do(func() { s.slots.release(namespace) }) }
	for {
		freed, ok := s.slots.take(namespace)
		if ok {
			job.queued.Store(false)
			return release, nil
		}
		job.queued.Store(true)
		select {
		case <-freed:
		case <-ctx.Done():
			job.queued.Store(false)
			return nil, errors.Wrap(ctx.Err(), "stopped waiting for a download slot")
		}
	}
}

// countingWriter counts the bytes written through it, for progress.
type countingWriter struct{ n *atomic.Int64 }

func (w countingWriter) Write(p []byte) (int, error) {
	w.n.Add(int64(len(p)))
	return len(p), nil
}

// Download streams img.URL into a file of the store's Dir, and returns the
// file's path and size once it passed img's checksum and inspection
// (Inspect, as img's format). It waits for a download slot first, then
// connects only where the download policy allows (fetch.go) and stops at
// the store's size and time limits; the job's progress follows it. The
// caller removes the file once done with it; a failed download leaves
// nothing. An error the node's policy caused is a refusal (IsRefusal).
func (j *Job) Download(ctx context.Context, img *driver.Image) (string, int64, error) {
	s := j.s
	u, err := parseSource(img.URL)
	if err != nil {
		return "", 0, errors.Errorf("cannot import image %s: %w", img.Name, err)
	}
	release, err := s.acquire(ctx, j, img.Namespace)
	if err != nil {
		return "", 0, errors.Wrapf(err, "cannot import image %s", img.Name)
	}
	defer release()
	if err := os.MkdirAll(s.cfg.Dir, 0o700); err != nil {
		return "", 0, errors.Wrap(err, "cannot create the image download directory")
	}
	f, err := os.CreateTemp(s.cfg.Dir, partPrefix+img.UID+"-*.part")
	if err != nil {
		return "", 0, errors.Wrap(err, "cannot create the image download file")
	}
	n, err := j.fetch(ctx, img, u, f)
	if cerr := f.Close(); err == nil && cerr != nil {
		err = errors.Wrap(cerr, "cannot write the image download file")
	}
	if err == nil {
		if err = Inspect(f.Name(), cmp.Or(img.Format, defaultFormat)); err != nil {
			err = errors.Errorf("cannot import image %s: %w", img.Name, err)
		}
	}
	if err != nil {
		_ = os.Remove(f.Name())
		return "", 0, err
	}
	return f.Name(), n, nil
}

// fetch writes what img.URL (parsed: u) answers to w, within the store's
// size and time limits, and returns how many bytes it wrote once they
// passed img's checksum.
func (j *Job) fetch(ctx context.Context, img *driver.Image, u *url.URL, w io.Writer) (int64, error) {
	s := j.s
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, img.URL, nil)
	if err != nil {
		return 0, errors.Errorf("cannot import image %s: bad URL %q: %v", img.Name, img.URL, err)
	}
	client := fetchClient(img.AllowedSources)
	defer client.CloseIdleConnections()
	resp, err := client.Do(req)
	if r := refusalOf(err); r != nil {
		// Only the refusal: the URL of a redirect is the server's to tell.
		return 0, errors.Errorf("cannot import image %s: %w", img.Name, r)
	}
	if err != nil {
		return 0, errors.Errorf("cannot import image %s: %v", img.Name, s.timedOut(ctx, err))
	}
	defer resp.Body.Close() //nolint:errcheck // read-only body
	if resp.StatusCode != http.StatusOK {
		return 0, errors.Errorf("cannot import image %s: GET %s answered %s", img.Name, img.URL, resp.Status)
	}
	maxBytes := s.cfg.MaxBytes
	if resp.ContentLength > maxBytes {
		return 0, errors.Errorf("cannot import image %s: %w", img.Name, &TooLargeError{Host: u.Hostname(), Size: resp.ContentLength, Max: maxBytes})
	}
	j.total.Store(resp.ContentLength)
	h := sha256.New()
	// One byte past the limit tells a body at the limit from one over it.
	n, err := io.Copy(io.MultiWriter(w, h, countingWriter{&j.read}), io.LimitReader(resp.Body, maxBytes+1))
	if err != nil {
		return 0, errors.Errorf("cannot import image %s: download from %s broke off after %d bytes: %v", img.Name, img.URL, n, s.timedOut(ctx, err))
	}
	if n > maxBytes {
		return 0, errors.Errorf("cannot import image %s: %w", img.Name, &TooLargeError{Host: u.Hostname(), Size: -1, Max: maxBytes})
	}
	if got := hex.EncodeToString(h.Sum(nil)); img.SHA256 != "" && got != img.SHA256 {
		return 0, errors.Errorf("image %s from %s failed its checksum: expected sha256 %s, got %s; nothing was kept", img.Name, img.URL, img.SHA256, got)
	}
	return n, nil
}

// timedOut names the download's time limit when ctx ran out of it, and
// returns err otherwise.
func (s *Imports) timedOut(ctx context.Context, err error) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return errors.Errorf("the download did not finish within this node's limit of %s", s.cfg.Timeout)
	}
	return err
}
