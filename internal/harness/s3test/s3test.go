// Package s3test runs a real S3-compatible object store, SeaweedFS's
// `weed server -s3`, for tests and for `make run`. The weed binary is built
// once per machine from SeaweedFS's Go module into the cache directory
// (internal/harness/modbuild), as the control plane's binaries are.
//
// A Server is one weed process: master, volume server, filer and S3 gateway,
// listening on 127.0.0.1 only, keeping everything it stores in one
// directory. It always has authentication on: it knows one identity, with a
// random access and secret key, and refuses anonymous requests. Clients
// speak plain HTTP to Endpoint.
//
// The process runs in a process group of its own, which Stop kills. A test
// binary that is killed before it stops its servers leaves their weed
// processes running; each Start kills those a dead process started (see
// RunDir), so a killed test leaves nothing behind for long.
package s3test

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/virtfleet/virtfleet/internal/harness/freeport"
	"github.com/virtfleet/virtfleet/internal/harness/modbuild"
)

// Module is SeaweedFS's Go module.
const Module = "github.com/seaweedfs/seaweedfs"

// Version of SeaweedFS the tests run: a pseudo-version, as SeaweedFS tags
// no Go module releases.
const Version = "v0.0.0-20261109003541-7506e5f91cd6"

// Region every Server answers for; clients sign their requests for it.
const Region = "us-east-1"

// CacheDir is where Ensure keeps the weed binary.
func CacheDir() (string, error) { return modbuild.CacheDir("seaweedfs", Version) }

// RunDir holds one record per running weed process that Start started on
// this machine, naming it and the process that started it. Start kills the
// weed processes whose starter is gone.
func RunDir() (string, error) { return modbuild.CacheDir("seaweedfs", "run") }

// Ensure returns the weed binary, building it into CacheDir the first time
// (a slow build), with progress written to progress; concurrent callers
// wait for one build.
func Ensure(ctx context.Context, progress io.Writer) (string, error) {
	dir, err := CacheDir()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "weed")
	if built(bin) {
		return bin, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", errors.Wrap(err, "cannot create SeaweedFS's cache directory")
	}
	unlock, err := modbuild.Lock(ctx, filepath.Join(dir, ".lock"), progress)
	if err != nil {
		return "", err
	}
	defer unlock()
	if built(bin) { // built while we waited for the lock
		return bin, nil
	}
	t := modbuild.Target{
		Binary: "weed", Module: Module, Version: Version, Package: Module + "/weed",
		// SeaweedFS's go.mod replaces go-bip39, deleted from GitHub, with
		// cosmos's copy; a module that requires SeaweedFS must say so
		// itself, as replacements apply in the main module only.
		Replace: []string{"github.com/tyler-smith/go-bip39=github.com/cosmos/go-bip39@v1.0.0"},
	}
	if err := modbuild.Build(ctx, dir, t, modbuild.Prefixed(progress, "seaweedfs: ")); err != nil {
		return "", errors.Wrapf(err, "cannot build SeaweedFS %s", Version)
	}
	return bin, nil
}

func built(bin string) bool {
	fi, err := os.Stat(bin)
	return err == nil && fi.Mode().IsRegular()
}

// Server is a running weed process with its S3 gateway.
type Server struct {
	// Endpoint is the S3 gateway's host:port on 127.0.0.1, plain HTTP.
	Endpoint string
	// Region requests are signed for.
	Region string
	// AccessKey and SecretKey are the one identity's credentials; it may
	// do anything.
	AccessKey, SecretKey string

	dir    string // the directory Start was given
	proc   *process
	stopMu sync.Once
}

const (
	// readyWithin bounds one start. Generous: alone on two cores weed
	// answers within seconds, but a loaded machine running the whole test
	// suite in parallel can take many times as long.
	readyWithin = 2 * time.Minute
	// startAttempts is how often Start tries when a port it picked was
	// taken before weed bound it.
	startAttempts = 3
	// logName is weed's log in the directory Start is given.
	logName = "weed.log"
)

// errPortTaken says that another process bound a port weed was to listen
// on after it was picked: a start on other ports may well succeed.
var errPortTaken = errors.New("a port picked for weed was taken before it bound it")

// Start runs weed in dir, which keeps its data (dir/data), its S3
// identities (dir/s3.json) and its log (dir/weed.log), and returns once its
// S3 gateway answers a signed request and has taken a write (probeWrite).
// First it kills any weed a killed run left behind (see RunDir). When a
// port it picked was taken before weed bound it, it starts weed again on
// other ports. On a failed start the error ends with the end of weed's log.
func Start(ctx context.Context, dir string, progress io.Writer) (*Server, error) {
	bin, err := Ensure(ctx, progress)
	if err != nil {
		return nil, err
	}
	runDir, err := RunDir()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(runDir, 0o755); err != nil {
		return nil, errors.Wrap(err, "cannot create SeaweedFS's run directory")
	}
	if err := killLeftovers(ctx, runDir, progress); err != nil {
		return nil, err
	}
	s := &Server{Region: Region, dir: dir}
	// Random keys, as long as AWS's and longer.
	s.AccessKey, s.SecretKey = rand.Text(), rand.Text()+rand.Text()
	if err := os.MkdirAll(filepath.Join(dir, "data"), 0o755); err != nil {
		return nil, errors.Wrap(err, "cannot create weed's data directory")
	}
	if err := writeIdentities(filepath.Join(dir, "s3.json"), s.AccessKey, s.SecretKey); err != nil {
		return nil, err
	}
	for attempt := 1; ; attempt++ {
		err := s.start(ctx, bin, runDir, attempt, progress)
		if err == nil {
			return s, nil
		}
		if !errors.Is(err, errPortTaken) || attempt == startAttempts {
			return nil, err
		}
		fmt.Fprintf(progress, "seaweedfs: %v; starting again on other ports\n", errPortTaken)
	}
}

// ports are the TCP ports one weed listens on: each of its servers has
// an HTTP and a gRPC port.
type ports struct {
	master, masterGRPC, volume, volumeGRPC, filer, filerGRPC, s3, s3GRPC int
}

// pick picks a free port; a test can make it pick a taken one.
var pick = freeport.Pick

func pickPorts() (ports, error) {
	var p ports
	for _, port := range []*int{&p.master, &p.masterGRPC, &p.volume, &p.volumeGRPC, &p.filer, &p.filerGRPC, &p.s3, &p.s3GRPC} {
		var err error
		if *port, err = pick(); err != nil {
			return ports{}, err
		}
	}
	return p, nil
}

// args is weed's command line.
func (p ports) args(dir string) []string {
	flag := func(name string, v any) string { return fmt.Sprintf("-%s=%v", name, v) }
	return []string{
		// glog writes files into the system's temporary directory
		// unless told to log to stderr, our log.
		"-logtostderr",
		"server",
		flag("ip", "127.0.0.1"), flag("ip.bind", "127.0.0.1"),
		flag("dir", filepath.Join(dir, "data")),
		flag("master.port", p.master), flag("master.port.grpc", p.masterGRPC),
		flag("volume.port", p.volume), flag("volume.port.grpc", p.volumeGRPC),
		flag("filer.port", p.filer), flag("filer.port.grpc", p.filerGRPC),
		flag("s3", true), flag("s3.port", p.s3), flag("s3.port.grpc", p.s3GRPC),
		flag("s3.config", filepath.Join(dir, "s3.json")),
		// No Iceberg catalog, no Lance namespace server: more ports.
		flag("s3.port.iceberg", 0), flag("s3.port.lance", 0),
		// As S3 does: an upload into a missing bucket fails.
		flag("s3.autoCreateBucket", false),
		// Volumes as small as `weed mini` makes them; as many as the
		// disk holds, since each bucket is a collection of its own.
		flag("master.volumeSizeLimitMB", 128), flag("volume.max", 0),
		flag("master.telemetry", false),
	}
}

// sockets are the Unix sockets weed makes in /tmp for its own servers to
// talk to each other, named by port: only the filer's and the S3
// gateway's own could be moved, the gRPC ones cannot. A weed that is killed
// leaves them behind.
func (p ports) sockets() []string {
	return []string{
		fmt.Sprintf("/tmp/seaweedfs-master-grpc-%d.sock", p.masterGRPC),
		fmt.Sprintf("/tmp/seaweedfs-volume-grpc-%d.sock", p.volumeGRPC),
		fmt.Sprintf("/tmp/seaweedfs-filer-grpc-%d.sock", p.filerGRPC),
		fmt.Sprintf("/tmp/seaweedfs-s3-grpc-%d.sock", p.s3GRPC),
		fmt.Sprintf("/tmp/seaweedfs-filer-%d.sock", p.filer),
		fmt.Sprintf("/tmp/seaweedfs-s3-%d.sock", p.s3),
	}
}

// start makes one attempt to start weed on freshly picked ports.
func (s *Server) start(ctx context.Context, bin, runDir string, attempt int, progress io.Writer) error {
	p, err := pickPorts()
	if err != nil {
		return err
	}
	logPath := filepath.Join(s.dir, logName)
	began := time.Now()
	proc, err := launch(bin, s.dir, runDir, p, attempt)
	if err != nil {
		return err
	}
	s.Endpoint = net.JoinHostPort("127.0.0.1", strconv.Itoa(p.s3))
	// One try per poll: minio-go's retries would back off for seconds
	// while weed cannot answer yet, or has exited.
	client, err := s.client(s.AccessKey, s.SecretKey, 1)
	if err != nil {
		proc.stop()
		return err
	}
	var answered time.Duration
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, readyWithin, true, func(ctx context.Context) (bool, error) {
		if err := proc.exited(); err != nil {
			return false, err
		}
		if proc.portTaken() {
			return false, errPortTaken
		}
		if answered == 0 {
			ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			if _, err := client.ListBuckets(ctx); err != nil {
				return false, nil
			}
			answered = time.Since(began)
		}
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		return probeWrite(ctx, client) == nil, nil
	})
	if err != nil {
		taken := proc.portTaken()
		proc.stop()
		if taken {
			err = errPortTaken
		}
		return fmt.Errorf("weed did not start on %s (%w); the end of %s:\n%s", s.Endpoint, err, logPath, tail(logPath, 30))
	}
	s.proc = proc
	fmt.Fprintf(progress, "seaweedfs: weed (pid %d) on %s answered after %s, took a write after %s\n",
		proc.rec.PID, s.Endpoint, answered.Round(100*time.Millisecond), time.Since(began).Round(100*time.Millisecond))
	return nil
}

// probeBucket is the bucket probeWrite makes and removes.
const probeBucket = "s3test-probe"

// probeWrite writes an object and removes it again, with its bucket. weed
// answers requests seconds before it takes a write: its filer joins the
// lock ring that guards object writes only after it has waited for peers
// that a fresh store lacks, and until then a write waits.
func probeWrite(ctx context.Context, c *minio.Client) error {
	err := c.MakeBucket(ctx, probeBucket, minio.MakeBucketOptions{Region: Region})
	if code := minio.ToErrorResponse(err).Code; err != nil && code != "BucketAlreadyOwnedByYou" {
		return err
	}
	if _, err := c.PutObject(ctx, probeBucket, "probe", strings.NewReader("probe"), int64(len("probe")), minio.PutObjectOptions{}); err != nil {
		return err
	}
	if err := c.RemoveObject(ctx, probeBucket, "probe", minio.RemoveObjectOptions{}); err != nil {
		return err
	}
	return c.RemoveBucket(ctx, probeBucket)
}

// tail is the last n lines of a file.
func tail(path string, n int) string {
	b, _ := os.ReadFile(path) //nolint:gosec // our own log
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(len(lines)-n, 0):], "\n")
}

// Client is a minio-go client signed with the server's identity.
func (s *Server) Client() (*minio.Client, error) {
	return s.ClientWith(s.AccessKey, s.SecretKey)
}

// ClientWith is a minio-go client of the server that signs with other
// credentials, such as wrong ones.
func (s *Server) ClientWith(accessKey, secretKey string) (*minio.Client, error) {
	return s.client(accessKey, secretKey, 0)
}

// client is a minio-go client that tries a request up to tries times, or
// as often as minio-go does by default if tries is 0.
func (s *Server) client(accessKey, secretKey string, tries int) (*minio.Client, error) {
	c, err := minio.New(s.Endpoint, &minio.Options{
		Creds:      credentials.NewStaticV4(accessKey, secretKey, ""),
		Region:     s.Region,
		MaxRetries: tries,
	})
	return c, errors.Wrap(err, "cannot make an S3 client")
}

// MakeBucket creates bucket name.
func (s *Server) MakeBucket(ctx context.Context, name string) error {
	c, err := s.Client()
	if err != nil {
		return err
	}
	return errors.Wrapf(c.MakeBucket(ctx, name, minio.MakeBucketOptions{Region: s.Region}), "cannot make bucket %s", name)
}

// Stop kills weed's process group. It removes the sockets weed leaves and its record in RunDir;
// the directory Start was given stays.
func (s *Server) Stop() {
	s.stopMu.Do(func() {
		if s.proc != nil {
			s.proc.stop()
		}
	})
}

// New starts a server for a test in a temporary directory and stops it when
// the test ends. It skips the test with -short, which promises no real
// servers (and no build of weed), and when weed is not built and cannot be
// built here, for want of the go command.
func New(t testing.TB) *Server {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a real S3 server (SeaweedFS); skipped with -short")
	}
	ensure(t)
	s, err := Start(context.Background(), t.TempDir(), testWriter{t})
	if err != nil {
		t.Fatalf("cannot start SeaweedFS: %v", err)
	}
	t.Cleanup(s.Stop)
	return s
}

// ensure builds weed for a test, or skips it when weed is not built and the
// go command is missing.
func ensure(t testing.TB) {
	t.Helper()
	if dir, err := CacheDir(); err == nil && !built(filepath.Join(dir, "weed")) {
		if _, err := exec.LookPath("go"); err != nil {
			t.Skipf("needs the go command to build SeaweedFS once (make object-store): %v", err)
		}
	}
	if _, err := Ensure(context.Background(), testWriter{t}); err != nil {
		t.Fatalf("cannot build SeaweedFS: %v", err)
	}
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// s3Config is SeaweedFS's -s3.config file (its iam_pb.S3ApiConfiguration
// in JSON).
type s3Config struct {
	Identities []s3Identity `json:"identities"`
}

type s3Identity struct {
	Name        string         `json:"name"`
	Credentials []s3Credential `json:"credentials"`
	Actions     []string       `json:"actions"`
}

type s3Credential struct {
	AccessKey string `json:"accessKey"`
	SecretKey string `json:"secretKey"`
}

// writeIdentities writes an -s3.config file with one identity that may do
// anything. Without an identity for it, an anonymous request is refused.
func writeIdentities(path, accessKey, secretKey string) error {
	b, err := json.MarshalIndent(s3Config{Identities: []s3Identity{{
		Name:        "virtfleet",
		Credentials: []s3Credential{{AccessKey: accessKey, SecretKey: secretKey}},
		Actions:     []string{"Admin", "Read", "Write", "List", "Tagging"},
	}}}, "", "  ")
	if err != nil {
		return errors.Wrap(err, "cannot encode SeaweedFS's S3 identities")
	}
	return errors.Wrap(os.WriteFile(path, b, 0o600), "cannot write SeaweedFS's S3 identities")
}
