// Package guesthost runs a real hypervisor for tests: a system-mode libvirtd
// with the QEMU driver, its virtlogd, the
// libvirt "default" NAT network (bridge virbr0 and dnsmasq) and a "default"
// directory storage pool, all inside a network namespace of their own.
//
// Why a namespace of its own, and a daemon of its own even when the machine
// runs a system libvirtd: these machines may send traffic only to loopback or
// to test hosts in namespaces the run made itself, so the guests' bridge,
// NAT and DHCP must not live in the machine's namespace; and a test must leave
// the machine as it found it.
//
// How (with libvirt 9.0 and QEMU 7.2 on Debian 12, as root): the daemon is
// started with `ip netns exec`, which also gives it a mount namespace of its
// own. In there /run is a fresh tmpfs and libvirt's state, log, cache and
// config directories (/run/libvirt, /var/lib/libvirt, /var/log/libvirt,
// /var/cache/libvirt, /etc/libvirt) are bind mounts of directories under
// Host.Dir, so two hosts (or a system daemon) never share a pid file, a
// domain definition or a lease file, and the socket and QEMU's logs are
// reachable from the machine's namespace under Dir. Processes in other
// namespaces (the agent) reach the daemon through Socket.
//
// Each daemon has a host_uuid of its own in its libvirtd.conf: libvirt
// refuses a migration between two daemons with the same host UUID as one
// "to the same host", and without one set every daemon here takes the
// machine's. StartPair runs two hosts joined by an underlay, as two
// hypervisors on one network are, each daemon listening on TCP on its
// underlay address alone for the other's live migrations (a host of its own
// listens on its unix socket only).
package guesthost

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/digitalocean/go-libvirt"
	"github.com/google/uuid"
	"k8s.io/apimachinery/pkg/util/wait"
	"libvirt.org/go/libvirtxml"
)

// URI is the libvirt URI the daemon serves.
const URI = "qemu:///system"

// Pool and Network are the storage pool and NAT network the host serves.
const (
	Pool    = "default"
	Network = "default"
)

// DomainType is the libvirt domain type the host's guests run as: qemu,
// QEMU's own emulation (TCG), even where the machine offers KVM. CI has no
// KVM, and the nested KVM a test machine may offer cannot be trusted to run
// a guest: on one (kvm-pvm) the guest's boot loader stops with "KVM internal
// error. Suberror: 1 emulation failure" and the domain sits paused. TCG is
// slower, never wrong, and the same everywhere.
const DomainType = "qemu"

// startTimeout bounds how long the daemon may take to accept connections.
const startTimeout = 30 * time.Second

// Required are the commands a host needs (hack/deps.sh installs them).
var Required = []string{"ip", "libvirtd", "virtlogd", "setpriv", "qemu-system-x86_64", "dnsmasq", "iptables"}

// Host is a running hypervisor in its own network namespace.
type Host struct {
	// Netns is the network namespace guests and their network live in.
	Netns string
	// Dir holds the daemon's directories (run/, lib/, log/, cache/, etc/).
	Dir string
	// Socket is the daemon's read-write unix socket.
	Socket string
	// URI is the libvirt URI to open over Socket.
	URI string
	// UUID is the daemon's host_uuid, what its capabilities say.
	UUID string
	// NetnsPath is the namespace's path, for what enters it by path (an
	// agent putting devices beside libvirtd's bridges).
	NetnsPath string
	// TunnelAddress is the host's address on a Pair's underlay (link
	// UnderlayLink); empty on a host of its own.
	TunnelAddress string
	// MigrationURI is the URI the other host of a Pair migrates guests
	// here with (qemu+tcp to TunnelAddress, where this host's libvirtd
	// listens); empty on a host of its own, which listens on no TCP port.
	MigrationURI string

	cmd    *exec.Cmd
	exited chan struct{}
	log    *os.File
}

// Missing names the required commands that are not installed, and whether
// the caller lacks root, for a test to skip with a reason.
func Missing() []string {
	return MissingFrom(Required, "network namespaces, a system-mode libvirtd")
}

// MissingFrom names the commands of required that are not installed, and
// root, needed for why, when the caller lacks it: what a harness that runs
// daemons in namespaces of their own says it needs.
func MissingFrom(required []string, why string) []string {
	var out []string
	for _, c := range required {
		if _, err := exec.LookPath(c); err != nil {
			out = append(out, c)
		}
	}
	if os.Geteuid() != 0 {
		out = append(out, "root ("+why+")")
	}
	return out
}

// Start starts a host named name (a short prefix: it names the namespace and
// the directory). progress gets a line per step.
func Start(ctx context.Context, name string, progress io.Writer) (*Host, error) {
	h, err := create(ctx, name)
	if err != nil {
		return nil, err
	}
	if err := h.run(ctx, progress); err != nil {
		h.Stop()
		return nil, err
	}
	return h, nil
}

// create makes a host's directory, configuration and network namespace,
// everything but its daemons, so that a Pair can join the namespaces
// before the daemons start listening in them. A failure leaves nothing.
func create(ctx context.Context, name string) (*Host, error) {
	if m := Missing(); len(m) > 0 {
		return nil, errors.Errorf("cannot run a guest host without %s (run make deps as root)", strings.Join(m, ", "))
	}
	removeLeftovers(name, os.Stderr)
	// Not a test's TempDir: a unix socket path must stay under 108 bytes.
	dir, err := os.MkdirTemp("", "vf-"+name+"-")
	if err != nil {
		return nil, errors.Wrap(err, "cannot create the host directory")
	}
	h := &Host{
		Netns:  fmt.Sprintf("%s-%d-%s", name, os.Getpid(), filepath.Base(dir)[len("vf-"+name+"-"):]),
		Dir:    dir,
		Socket: filepath.Join(dir, "run", "libvirt-sock"),
		URI:    URI,
		UUID:   uuid.NewString(),
		exited: make(chan struct{}),
	}
	h.NetnsPath = filepath.Join("/run/netns", h.Netns)
	if err := h.setUp(ctx); err != nil {
		h.Stop()
		return nil, err
	}
	return h, nil
}

// DaemonScript runs a libvirtd of its own, with its virtlogd, in a mount
// namespace of its own (ip netns exec gives one, as Start's hosts have;
// unshare --mount makes one, as the OpenStack harness's real compute host
// has): `bash -c DaemonScript libvirtd DIR [libvirtd's flags]`. In there
// /run is a fresh tmpfs and libvirt's state, log, cache and configuration
// directories are bind mounts of DIR's run, lib, log, cache and etc, so
// the daemon shares nothing with the machine's libvirt. virtlogd and
// libvirtd run in the foreground, so both stay in the process group the
// caller signals to stop them; virtlogd dies with libvirtd (which the
// script becomes), should libvirtd die first.
//
// Guests come first on the machine: libvirt starts each QEMU in a session
// of its own, which the kernel schedules as one autogroup against every
// other session's (the tests', the daemons'), so a guest booting under TCG
// beside a busy suite got a small share of a core and took minutes more to
// boot. The daemon's qemu hook gives each QEMU's autogroup nice -5 when
// the guest starts, three times the weight of a session at nice 0: against
// the two sessions of a busy make test a booting guest gets about a core,
// as on an idle machine. One guest boots at a time (guestimage.HoldBoot)
// and an idle guest uses next to nothing, so the rest keeps the other core;
// where a step boots two guests at once (two hosts), nice -10 left the
// rest too little for a daemon to answer in its seconds, -5 leaves it half
// a core.
const DaemonScript = `set -e
d=$1
mkdir -p "$d/etc/hooks"
cat >"$d/etc/hooks/qemu" <<'HOOK'
#!/bin/sh
[ "$2" = started ] || exit 0
pid=$(cat "/run/libvirt/qemu/$1.pid") || exit 0
[ "$(ps -o sid= -p "$pid")" != "$(ps -o sid= -p "$PPID")" ] && echo -5 >"/proc/$pid/autogroup"
exit 0
HOOK
chmod 755 "$d/etc/hooks/qemu"
mount -t tmpfs tmpfs /run
mkdir -p /run/libvirt /run/lock
mount --bind "$d/run" /run/libvirt
mount --bind "$d/lib" /var/lib/libvirt
mount --bind "$d/log" /var/log/libvirt
mount --bind "$d/cache" /var/cache/libvirt
mount --bind "$d/etc" /etc/libvirt
shift
setpriv --pdeathsig KILL virtlogd &
exec libvirtd "$@"
`

// setUp makes the host's directories, its configuration and its network
// namespace.
func (h *Host) setUp(ctx context.Context) error {
	for _, sub := range []string{"run", "lib/images", "lib/dnsmasq", "log/qemu", "cache", "etc"} {
		if err := os.MkdirAll(filepath.Join(h.Dir, sub), 0o755); err != nil {
			return errors.Wrap(err, "cannot create the host directories")
		}
	}
	// QEMU runs as libvirt-qemu and must reach its disks through Dir.
	if err := os.Chmod(h.Dir, 0o755); err != nil {
		return errors.Wrap(err, "cannot open the host directory")
	}
	// The machine's libvirt configuration (qemu.conf, the default network),
	// copied so the daemon's changes stay in Dir.
	if out, err := exec.CommandContext(ctx, "cp", "-a", "/etc/libvirt/.", filepath.Join(h.Dir, "etc")).CombinedOutput(); err != nil {
		return errors.Errorf("cannot copy /etc/libvirt: %v: %s", err, out)
	}
	if err := h.setHostUUID(); err != nil {
		return err
	}
	if out, err := exec.CommandContext(ctx, "ip", "netns", "add", h.Netns).CombinedOutput(); err != nil {
		return errors.Errorf("cannot create network namespace %s: %v: %s", h.Netns, err, out)
	}
	if out, err := h.Command(ctx, "ip", "link", "set", "lo", "up").CombinedOutput(); err != nil {
		return errors.Errorf("cannot bring up loopback in %s: %v: %s", h.Netns, err, out)
	}
	return nil
}

// run starts the host's daemons with args for libvirtd, waits until
// libvirtd accepts connections, and makes its network and pool.
func (h *Host) run(ctx context.Context, progress io.Writer, args ...string) error {
	log, err := os.Create(filepath.Join(h.Dir, "libvirtd.log"))
	if err != nil {
		return errors.Wrap(err, "cannot create the daemon log")
	}
	h.log = log
	h.cmd = exec.Command("ip", append([]string{"netns", "exec", h.Netns, "bash", "-c", DaemonScript, "libvirtd", h.Dir}, args...)...) //nolint:gosec // our own script
	h.cmd.Stdout, h.cmd.Stderr = log, log
	// ip execs the script, which execs libvirtd: the parent-death signal
	// reaches the daemon if the test binary dies; Stop reaps the rest.
	h.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := h.cmd.Start(); err != nil {
		return errors.Wrap(err, "cannot start libvirtd")
	}
	go func() { _ = h.cmd.Wait(); close(h.exited) }()
	fmt.Fprintf(progress, "guesthost: libvirtd (qemu:///system) in network namespace %s, socket %s\n", h.Netns, h.Socket)

	l, err := h.waitReady(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = l.Disconnect() }()
	return h.prepare(l)
}

// setHostUUID gives the daemon its own host UUID.
func (h *Host) setHostUUID() error {
	return h.configure("This host's own, so that hosts of one machine are different hosts to libvirt.", fmt.Sprintf("host_uuid = %q", h.UUID))
}

// configure appends settings to the daemon's libvirtd.conf, after whatever
// the machine's says (the last setting wins), with a comment saying why.
func (h *Host) configure(why string, settings ...string) error {
	f, err := os.OpenFile(filepath.Join(h.Dir, "etc", "libvirtd.conf"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return errors.Wrap(err, "cannot open the daemon's libvirtd.conf")
	}
	_, err = fmt.Fprintf(f, "\n# %s\n%s\n", why, strings.Join(settings, "\n"))
	return errors.Wrap(errors.Join(err, f.Close()), "cannot configure the daemon")
}

func (h *Host) waitReady(ctx context.Context) (*libvirt.Libvirt, error) {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	var l *libvirt.Libvirt
	err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(context.Context) (bool, error) {
		select {
		case <-h.exited:
			return false, errors.Errorf("libvirtd exited: %s", h.tail())
		default:
		}
		var err error
		l, err = h.Dial()
		return err == nil, nil
	})
	return l, errors.Wrapf(err, "libvirtd did not accept connections within %s", startTimeout)
}

// prepare starts the default network and makes the default pool in Dir.
func (h *Host) prepare(l *libvirt.Libvirt) error {
	n, err := l.NetworkLookupByName(Network)
	if err != nil {
		return errors.Wrap(err, "the machine's libvirt has no default network (/etc/libvirt/qemu/networks/default.xml)")
	}
	if active, err := l.NetworkIsActive(n); err != nil || active == 0 {
		if err := l.NetworkCreate(n); err != nil {
			return errors.Wrap(err, "cannot start the default network")
		}
	}
	return ensurePool(l, Pool, "/var/lib/libvirt/images")
}

// DefinePool defines, unless it is, and starts a directory pool named name
// at path, as an administrator declares a pool on shared storage on every
// host that reaches it.
func (h *Host) DefinePool(name, path string) error {
	l, err := h.Dial()
	if err != nil {
		return err
	}
	defer func() { _ = l.Disconnect() }()
	return ensurePool(l, name, path)
}

// ensurePool defines, unless it is, and starts the directory pool name at
// path.
func ensurePool(l *libvirt.Libvirt, name, path string) error {
	x, err := (&libvirtxml.StoragePool{Type: "dir", Name: name, Target: &libvirtxml.StoragePoolTarget{Path: path}}).Marshal()
	if err != nil {
		return errors.Wrap(err, "cannot marshal the pool")
	}
	p, err := l.StoragePoolLookupByName(name)
	if err != nil {
		if p, err = l.StoragePoolDefineXML(x, 0); err != nil {
			return errors.Wrapf(err, "cannot define pool %s", name)
		}
	}
	if active, err := l.StoragePoolIsActive(p); err != nil || active == 0 {
		if err := l.StoragePoolCreate(p, 0); err != nil {
			return errors.Wrapf(err, "cannot start pool %s", name)
		}
	}
	return nil
}

// Dial opens a new connection to the daemon.
func (h *Host) Dial() (*libvirt.Libvirt, error) {
	c, err := net.DialTimeout("unix", h.Socket, 2*time.Second)
	if err != nil {
		return nil, errors.Wrap(err, "cannot reach libvirtd")
	}
	l := libvirt.New(c) //nolint:staticcheck // the dialer API needs a URI-less local socket path per host
	if err := l.ConnectToURI(libvirt.ConnectURI(h.URI)); err != nil {
		_ = c.Close()
		return nil, errors.Wrapf(err, "cannot open %s", h.URI)
	}
	return l, nil
}

// Command runs name inside the host's network namespace (ssh to a guest, say).
func (h *Host) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	return inNetns(ctx, h.Netns, name, args...)
}

// inNetns runs name inside network namespace netns.
func inNetns(ctx context.Context, netns, name string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", netns, name}, args...)...) //nolint:gosec // test commands
}

// SSH runs command in a guest as user, logging in with the private key in
// file key, from inside the host's network namespace (the only place the
// guest's address is reachable from). It gives up after 30 s.
func (h *Host) SSH(ctx context.Context, key, user, ip, command string) (string, error) {
	return SSHFrom(ctx, h.Netns, key, user, ip, command)
}

// SSHFrom runs command in a guest as Host.SSH does, from inside network
// namespace netns: a Host's, or another place the guest's address is
// reachable from only (a cloud's DHCP namespace of the guest's network).
// It gives up after 30 s.
func SSHFrom(ctx context.Context, netns, key, user, ip, command string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err := SSHCommand(ctx, netns, key, user, ip, command).CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

// SSHCommand is the ssh, run inside network namespace netns, of command in
// the guest at ip as user with the private key in file key, for a caller
// that reads its output as it comes.
//
// Every ssh to one guest from one place shares a connection (OpenSSH's
// ControlMaster): a new connection costs the guest an sshd re-exec, a key
// exchange and a PAM session, seconds of CPU under TCG on a busy machine,
// where a shared one costs a channel. The connection ends once idle for
// ControlPersist, or once the guest has not answered for ServerAliveInterval
// times ServerAliveCountMax (rebooted, paused, stopped), and the next ssh
// opens a new one. A guest brought back to an earlier state of its memory
// knows nothing of a connection made since: SSHDisconnect ends it first.
func SSHCommand(ctx context.Context, netns, key, user, ip, command string) *exec.Cmd {
	// Without its directory, ssh would run each command on a connection
	// of its own.
	_ = os.MkdirAll(filepath.Join(sshControlDir, netns), 0o700)
	return inNetns(ctx, netns, "ssh", append(sshOptions(netns, key, user, ip),
		"-o", "ControlMaster=auto", "-o", "ControlPersist=30", "-o", "ServerAliveInterval=2", "-o", "ServerAliveCountMax=3",
		user+"@"+ip, command)...)
}

// SSHDisconnect ends the connection SSHCommand's ssh to the guest at ip
// share, if one is open.
func SSHDisconnect(ctx context.Context, netns, key, user, ip string) {
	_ = inNetns(ctx, netns, "ssh", append(sshOptions(netns, key, user, ip), "-O", "exit", user+"@"+ip)...).Run()
}

// sshControlDir holds the sockets of the shared connections to guests.
var sshControlDir = filepath.Join(os.TempDir(), "vf-ssh")

// sshOptions are the options every ssh to a test guest takes: no host key
// check (each guest makes its keys at its first boot), the key alone, no
// prompt, and the path of the connection to the guest from netns as user
// with key: a hash of the three in a directory of netns's (two namespaces
// can each reach a guest of their own at one address), short enough for a
// socket's path (at most 107 bytes), which a Host's Stop removes.
func sshOptions(netns, key, user, ip string) []string {
	sum := sha256.Sum256([]byte(strings.Join([]string{key, user, ip}, "\x00")))
	return []string{"-i", key,
		"-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
		"-o", "ConnectTimeout=5", "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
		"-o", "ControlPath=" + filepath.Join(sshControlDir, netns, hex.EncodeToString(sum[:12])),
	}
}

// SSHUntil runs command as SSHFrom does, at once and then every interval,
// until the guest's sshd lets the key in and command succeeds, or until
// timeout (or ctx) ends: an emulated guest on a busy machine can take long
// to answer even once it is up. It returns the last output and the last
// error of ssh, nil once it succeeded.
func SSHUntil(ctx context.Context, netns, key, user, ip, command string, interval, timeout time.Duration) (string, error) {
	var out string
	var err error
	_ = wait.PollUntilContextTimeout(ctx, interval, timeout, true, func(context.Context) (bool, error) {
		out, err = SSHFrom(ctx, netns, key, user, ip, command)
		return err == nil, nil
	})
	return out, err
}

// QEMULog is QEMU's log of a domain (/var/log/libvirt/qemu/<domain>.log inside).
func (h *Host) QEMULog(domain string) (string, error) {
	b, err := os.ReadFile(filepath.Join(h.Dir, "log", "qemu", domain+".log"))
	return string(b), errors.Wrap(err, "cannot read the QEMU log")
}

// LibDir is where the daemon's /var/lib/libvirt/sub is seen from outside
// its mount namespace: LibDir("qemu") is the QEMU driver's directory, where
// guests' console sockets are by default (the libvirt driver's
// ConsoleLocalDir for its default ConsoleDir).
func (h *Host) LibDir(sub string) string { return filepath.Join(h.Dir, "lib", sub) }

// LogPath is the daemon's own log.
func (h *Host) LogPath() string { return filepath.Join(h.Dir, "libvirtd.log") }

func (h *Host) tail() string {
	b, _ := os.ReadFile(h.LogPath())
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// Describe says whether the host's libvirtd still runs and answers, and
// how its log ends, for a failed test's output: the log goes with Dir. A
// daemon that does not answer is given a few seconds to be seen exiting, and
// how it ended (a signal, a status) is said: a crashed daemon has closed its
// socket before its parent can know it died.
func (h *Host) Describe() string {
	state := "running, answers"
	if l, err := h.Dial(); err != nil {
		state = fmt.Sprintf("running, does not answer: %v", err)
		select {
		case <-h.exited:
		case <-time.After(5 * time.Second):
		}
	} else {
		_ = l.Disconnect()
	}
	select {
	case <-h.exited:
		state = fmt.Sprintf("exited (%s)", h.cmd.ProcessState)
	default:
	}
	return fmt.Sprintf("libvirtd of %s: %s; the end of its log:\n%s", h.Netns, state, h.tail())
}

// StopWith has the host stopped when t ends, after saying how its daemon
// fared if t failed.
func (h *Host) StopWith(t interface {
	Cleanup(func())
	Failed() bool
	Log(...any)
}) {
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(h.Describe())
		}
		h.Stop()
	})
}

// Stop destroys the host's guests, stops its daemons and every process left
// in its namespace (dnsmasq, QEMU), and removes the namespace and Dir.
func (h *Host) Stop() {
	if h.cmd != nil && h.cmd.Process != nil {
		if l, err := h.Dial(); err == nil {
			// A destroyed guest releases its cgroup and its disks cleanly.
			if doms, _, err := l.ConnectListAllDomains(1, libvirt.ConnectListDomainsActive); err == nil {
				for _, d := range doms {
					_ = l.DomainDestroy(d)
				}
			}
			if n, err := l.NetworkLookupByName(Network); err == nil {
				_ = l.NetworkDestroy(n)
			}
			_ = l.Disconnect()
		}
		StopGroup(h.cmd.Process.Pid, h.exited, 15*time.Second)
	}
	h.killStragglers()
	if h.Netns != "" {
		removeNeighbour(h.Netns)
		_ = exec.Command("ip", "netns", "del", h.Netns).Run()
		// The sockets of the ssh connections killStragglers ended.
		_ = os.RemoveAll(filepath.Join(sshControlDir, h.Netns))
	}
	if h.log != nil {
		_ = h.log.Close()
	}
	if h.Dir != "" && os.Getenv("VIRTFLEET_KEEP_GUEST_HOST") == "" {
		_ = os.RemoveAll(h.Dir)
	}
}

// Crash kills the host as a power loss would: its libvirtd and every process
// in its namespace (QEMU, dnsmasq) with SIGKILL, nothing shut down. Stop
// still cleans up after it.
func (h *Host) Crash() {
	if h.cmd != nil && h.cmd.Process != nil {
		_ = syscall.Kill(-h.cmd.Process.Pid, syscall.SIGKILL)
		<-h.exited
	}
	h.killStragglers()
}

// killStragglers ends what is still running in the namespace: only processes
// this host started live there.
func (h *Host) killStragglers() {
	if h.Netns != "" {
		KillNetns(h.Netns)
	}
}

// leftover matches the namespace of a host named name that create made:
// name, the pid of the process that made it, and its directory's suffix.
func leftover(name, netns string) (pid int, dir string, ok bool) {
	rest, found := strings.CutPrefix(netns, name+"-")
	if !found {
		return 0, "", false
	}
	p, suffix, found := strings.Cut(rest, "-")
	if !found || suffix == "" || strings.Contains(suffix, "-") {
		return 0, "", false
	}
	pid, err := strconv.Atoi(p)
	if err != nil {
		return 0, "", false
	}
	return pid, filepath.Join(os.TempDir(), "vf-"+name+"-"+suffix), true
}

// removeLeftovers removes the hosts named name that killed runs left: a
// namespace whose maker no longer runs, with its libvirtd, QEMU and dnsmasq
// (libvirtd outlives its test binary's death only by a moment, its guests
// and dnsmasq for good), and the host's directory. Hosts of running
// processes are theirs.
func removeLeftovers(name string, progress io.Writer) {
	entries, err := os.ReadDir("/run/netns")
	if err != nil {
		return
	}
	for _, e := range entries {
		pid, dir, ok := leftover(name, e.Name())
		if err := syscall.Kill(pid, 0); !ok || err == nil || errors.Is(err, syscall.EPERM) {
			continue
		}
		if _, err := os.Stat(filepath.Join(dir, "libvirtd.log")); err != nil {
			continue // not a directory of ours: the namespace is someone else's
		}
		fmt.Fprintf(progress, "guesthost: removing host %s (directory %s) that a killed run left behind\n", e.Name(), dir)
		KillNetns(e.Name())
		removeNeighbour(e.Name())
		_ = exec.Command("ip", "netns", "del", e.Name()).Run()
		_ = os.RemoveAll(dir)
	}
}

// KillNetns kills every process in network namespace name, for a harness
// whose namespace holds only processes it started, but never the calling
// process: ip counts a process as the namespace's when its main thread is
// there, and the main thread of a Go program runs any goroutine, among
// them those that enter the namespace for a moment (Within, a forwarder's
// dial) while another stops the host.
func KillNetns(name string) {
	out, err := exec.Command("ip", "netns", "pids", name).Output()
	if err != nil {
		return
	}
	for _, f := range strings.Fields(string(out)) {
		if pid, err := strconv.Atoi(f); err == nil && pid != os.Getpid() {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// StopGroup stops process group pgid with SIGTERM, and with SIGKILL if its
// leader has not exited within grace; exited is closed once the leader was
// reaped.
func StopGroup(pgid int, exited <-chan struct{}, grace time.Duration) {
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(grace):
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		<-exited
	}
}
