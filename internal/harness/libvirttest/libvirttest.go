// Package libvirttest runs one private libvirtd per simulated hypervisor node,
// the way envtest runs a private kube-apiserver: tests, benchmarks and
// `make run` talk to real daemons serving libvirt's test driver
// (test:///default), which simulates guests without KVM.
//
// How libvirt 9.0.0 behaves on Debian 12, as root:
//   - Two libvirtds in system mode collide on /run/libvirt/*/driver.pid, so
//     each node's daemon runs unprivileged in session mode with its own
//     XDG_RUNTIME_DIR, XDG_CONFIG_HOME, XDG_CACHE_HOME and HOME. From root,
//     privileges are dropped with `setpriv --reuid --regid --clear-groups`;
//     `--pdeathsig KILL` is applied after the uid change (the kernel clears a
//     parent-death signal set before it), so a crashed test leaves no daemon.
//   - The socket is $XDG_RUNTIME_DIR/libvirt/libvirt-sock and accepts
//     connections shortly after exec. The daemon logs errors about D-Bus, udev
//     DMI data and /dev/kvm; they are harmless for the test driver.
//   - The test driver keeps one shared state per daemon but discards it when
//     the last connection closes (a volume created by one `virsh` call is
//     gone at the next). A Node therefore holds a keeper connection for its
//     lifetime, so guests survive agent reconnects. Killing the daemon loses
//     that state: after Restart the node is empty again.
//   - A fresh state holds a running domain named "test", a "default" network,
//     a "default-pool" storage pool of 100 GiB and a host of 16 CPUs / 3 GiB.
package libvirttest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"
)

// URI is the libvirt connection URI every node serves.
const URI = "test:///default"

// Pool is the storage pool the test driver serves.
const Pool = "default-pool"

// nobody is the unprivileged account root-run daemons switch to. Each daemon
// is isolated by its directories, not its uid, so all may share it.
const nobody = 65534

// startTimeout bounds how long a daemon may take to accept connections.
const startTimeout = 10 * time.Second

// Node is one simulated hypervisor node: a private libvirtd and the keeper
// connection that keeps its test-driver state alive.
type Node struct {
	// Name of the simulated node.
	Name string
	// Dir holds the daemon's runtime, config, cache and home directories.
	Dir string
	// Socket is the path of the daemon's read-write unix socket.
	Socket string
	// URI is the libvirt URI to open over Socket.
	URI string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
	keeper *libvirt.Libvirt
	// pools are the pools DefinePool defined, by name, defined again on
	// every start: the test driver starts from its fresh state.
	pools map[string]string
}

// Start starts a node for a test and stops it when the test ends. It skips
// the test when libvirtd is not installed.
func Start(t testing.TB, node string) *Node {
	t.Helper()
	if _, err := exec.LookPath("libvirtd"); err != nil {
		t.Skip("libvirtd is not installed; run `make deps` (installs libvirt-daemon-system and libvirt-clients)")
	}
	// Not t.TempDir: a unix socket path must stay under 108 bytes and test
	// names can be long.
	dir, err := os.MkdirTemp("", "vf-"+node+"-")
	if err != nil {
		t.Fatalf("cannot create node directory: %v", err)
	}
	n, err := StartNode(context.Background(), dir, node)
	if err != nil {
		_ = os.RemoveAll(dir)
		t.Fatalf("cannot start libvirtd for node %s: %v", node, err)
	}
	t.Cleanup(func() {
		n.Stop()
		_ = os.RemoveAll(dir)
	})
	return n
}

// StartNode starts a node whose daemon keeps its files under dir, for callers
// that are not tests (make run, benchmarks). Call Stop when done.
func StartNode(ctx context.Context, dir, node string) (*Node, error) {
	n := &Node{
		Name:   node,
		Dir:    dir,
		Socket: filepath.Join(dir, "run", "libvirt", "libvirt-sock"),
		URI:    URI,
	}
	if len(n.Socket) >= 108 {
		return nil, errors.Errorf("socket path %s is too long for a unix socket", n.Socket)
	}
	if err := n.prepareDirs(); err != nil {
		return nil, err
	}
	if err := n.start(ctx); err != nil {
		return nil, err
	}
	return n, nil
}

// Kill kills the daemon with SIGKILL, as a crash would; the node's guests are
// lost with it.
func (n *Node) Kill() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.killLocked()
}

// Restart kills the daemon if it runs and starts a new one on the same
// socket. The new daemon starts from the test driver's fresh state.
func (n *Node) Restart(ctx context.Context) error {
	n.Kill()
	return n.start(ctx)
}

// Stop stops the daemon; its state is discarded.
func (n *Node) Stop() {
	n.Kill()
}

// Log returns what the daemon wrote to stderr, for failure messages.
func (n *Node) Log() string {
	b, _ := os.ReadFile(n.LogPath())
	return string(b)
}

// State says whether the daemon runs and answers, for failure messages.
func (n *Node) State() string {
	n.mu.Lock()
	exited := n.exited
	n.mu.Unlock()
	if exited == nil {
		return "never started"
	}
	select {
	case <-exited:
		return "exited"
	default:
	}
	l, err := n.Dial()
	if err != nil {
		return fmt.Sprintf("running, does not answer: %v", err)
	}
	_ = l.Disconnect()
	return "running, answers"
}

// LogPath is the file the daemon writes its log to.
func (n *Node) LogPath() string { return filepath.Join(n.Dir, "libvirtd.log") }

// Dial opens a new go-libvirt connection to the node.
func (n *Node) Dial() (*libvirt.Libvirt, error) {
	return Dial(n.Socket)
}

// Dial opens a go-libvirt connection to the test driver behind a node's
// socket, for callers that know only the socket (an e2e test reading an
// agent's command line).
func Dial(socket string) (*libvirt.Libvirt, error) {
	c, err := net.DialTimeout("unix", socket, 2*time.Second)
	if err != nil {
		return nil, errors.Wrap(err, "cannot dial libvirtd")
	}
	l := libvirt.New(c)
	if err := l.ConnectToURI(libvirt.ConnectURI(URI)); err != nil {
		_ = c.Close()
		return nil, errors.Wrap(err, "cannot open libvirt connection")
	}
	return l, nil
}

func (n *Node) prepareDirs() error {
	uid, gid := daemonIDs()
	for _, d := range []string{"", "run", "config", "cache", "home"} {
		p := filepath.Join(n.Dir, d)
		if err := os.MkdirAll(p, 0o700); err != nil {
			return errors.Wrap(err, "cannot create node directory")
		}
		if err := os.Chown(p, uid, gid); err != nil {
			return errors.Wrap(err, "cannot hand node directory to the daemon's user")
		}
	}
	// The daemon's user must be able to reach Dir through its parents; the
	// parents are os.TempDir or a caller's directory, world-traversable.
	return nil
}

func (n *Node) start(ctx context.Context) error {
	n.mu.Lock()
	defer n.mu.Unlock()

	argv := []string{"libvirtd"}
	if os.Geteuid() == 0 {
		uid, gid := daemonIDs()
		argv = []string{"setpriv",
			"--reuid=" + strconv.Itoa(uid), "--regid=" + strconv.Itoa(gid), "--clear-groups",
			"--pdeathsig=KILL", "--", "libvirtd"}
	}
	cmd := exec.Command(argv[0], argv[1:]...) //nolint:gosec // fixed argv
	cmd.Dir = n.Dir
	cmd.Env = []string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + filepath.Join(n.Dir, "home"),
		"XDG_RUNTIME_DIR=" + filepath.Join(n.Dir, "run"),
		"XDG_CONFIG_HOME=" + filepath.Join(n.Dir, "config"),
		"XDG_CACHE_HOME=" + filepath.Join(n.Dir, "cache"),
	}
	logFile, err := os.Create(n.LogPath())
	if err != nil {
		return errors.Wrap(err, "cannot create libvirtd log")
	}
	defer logFile.Close() //nolint:errcheck // the child holds its own descriptor
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	// Also for a non-root run, where no setpriv sets it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return errors.Wrap(err, "cannot start libvirtd")
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	n.cmd, n.exited = cmd, exited

	keeper, err := n.waitReady(ctx, exited)
	if err != nil {
		n.killLocked()
		return errors.Wrapf(err, "libvirtd did not become ready; its log:\n%s", n.Log())
	}
	n.keeper = keeper
	for name, path := range n.pools {
		if err := n.definePool(name, path); err != nil {
			return err
		}
	}
	return nil
}

// waitReady dials until the daemon serves the test driver, and returns that
// first connection as the keeper.
func (n *Node) waitReady(ctx context.Context, exited <-chan struct{}) (*libvirt.Libvirt, error) {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	var last error
	for {
		l, err := n.Dial()
		if err == nil {
			return l, nil
		}
		last = err
		select {
		case <-exited:
			return nil, errors.New("libvirtd exited")
		case <-ctx.Done():
			return nil, errors.Wrap(last, "timed out")
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (n *Node) killLocked() {
	if n.keeper != nil {
		// The daemon is killed next; a clean close would only wait on it.
		n.keeper = nil
	}
	if n.cmd == nil {
		return
	}
	_ = n.cmd.Process.Kill()
	<-n.exited
	n.cmd = nil
}

// daemonIDs is the uid and gid the daemon runs as: nobody when started by
// root, otherwise the caller itself.
func daemonIDs() (int, int) {
	if os.Geteuid() == 0 {
		return nobody, nobody
	}
	return os.Geteuid(), os.Getegid()
}

// String names the node and its socket.
func (n *Node) String() string {
	return fmt.Sprintf("node %s (%s)", n.Name, n.Socket)
}

// DefinePool defines and starts a directory pool named name at path on the
// node, as an administrator declares a pool on shared storage on every host
// that reaches it. The test driver keeps its volumes in memory, per daemon:
// the pool has the shared pool's name and shape, not its files.
// A restarted daemon has it again.
func (n *Node) DefinePool(name, path string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.keeper == nil {
		return errors.Errorf("libvirtd of %s is not running", n.Name)
	}
	if err := n.definePool(name, path); err != nil {
		return err
	}
	if n.pools == nil {
		n.pools = map[string]string{}
	}
	n.pools[name] = path
	return nil
}

func (n *Node) definePool(name, path string) error {
	xml, err := (&libvirtxml.StoragePool{Type: "dir", Name: name, Target: &libvirtxml.StoragePoolTarget{Path: path}}).Marshal()
	if err != nil {
		return errors.Wrap(err, "cannot describe the pool")
	}
	p, err := n.keeper.StoragePoolDefineXML(xml, 0)
	if err != nil {
		return errors.Wrapf(err, "cannot define pool %s", name)
	}
	return errors.Wrapf(n.keeper.StoragePoolCreate(p, 0), "cannot start pool %s", name)
}
