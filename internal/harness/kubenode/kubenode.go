// Package kubenode runs a real Kubernetes node for tests: a kubelet of
// envtest's Kubernetes version (built once per machine by
// internal/harness/envtestassets) with a containerd of its own (Debian's,
// with runc and the bridge and host-local CNI plugins) and kube-proxy,
// registered with a test's API server; StartClusterDNS runs the cluster's
// CoreDNS on such nodes.
//
// Both run in a network namespace of their own, as guesthost's libvirtds
// do: the pods' bridge and subnet, and the node's own address (the kubelet
// refuses a loopback one), exist in there only. The API server and the
// registry the node pulls from listen on the machine's loopback; the node
// reaches them on the same ports of its own loopback, which the harness
// forwards, so no traffic leaves loopback or the node's namespace.
//
// They also run in a mount namespace of their own (unshare, with nsenter
// into the network namespace: `ip netns exec` would remount /sys and lose
// the cgroup hierarchies), where /run is a fresh tmpfs (containerd's shim
// sockets, the pods' network namespaces), /var/log is the node's directory
// (the pods' logs), and the kernel tunables the kubelet insists on are
// files of the node's (see kernelTunables). containerd's root, state and
// socket, the kubelet's root directory and the CNI plugins' leases are in
// the node's directory, so two nodes share nothing but the kernel.
//
// What cgroup v1 without systemd needs: cgroupDriver cgroupfs for the
// kubelet and containerd's runc (SystemdCgroup false), failCgroupV1 false,
// and a cgroup root of the node's own (cgroupRoot), made in every mounted
// hierarchy before the kubelet starts (it refuses a root that does not
// exist). The node's own processes (the kubelet, containerd, its shims)
// sit in a child of it in the pids hierarchy, beside the pods' kubepods,
// so that Stop, and the next Start after a killed run, find and kill
// every process of the node, containers included, and remove its cgroups.
package kubenode

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/internal/harness/controlplane"
	"github.com/virtfleet/virtfleet/internal/harness/guesthost"
	"github.com/virtfleet/virtfleet/internal/harness/procs"
	"github.com/virtfleet/virtfleet/internal/harness/relay"
)

// Required are the commands a node needs (hack/deps.sh installs them) and
// the CNI plugins it configures.
var Required = []string{
	"containerd", "containerd-shim-runc-v2", "runc", "ctr", "ip", "nsenter", "unshare", "setpriv", "mount", "iptables-restore",
	filepath.Join(cniBin, "bridge"), filepath.Join(cniBin, "host-local"), filepath.Join(cniBin, "loopback"),
}

// Missing names the required commands that are not installed, and whether
// the caller lacks root, for a test to say what it needs.
func Missing() []string {
	return guesthost.MissingFrom(Required, "namespaces, cgroups, containerd")
}

// Options say what node Start runs.
type Options struct {
	// Name is the node's name, and its kubelet's hostname.
	Name string
	// Kubelet is the kubelet binary.
	Kubelet string
	// Kubeconfig reaches the API server as the node (user
	// system:node:<Name> in group system:nodes) on 127.0.0.1.
	Kubeconfig string
	// KubeProxy, if set, is the kube-proxy binary the node runs beside its
	// kubelet, which makes Services' cluster IPs reach their pods in the
	// node's namespace, with ProxyKubeconfig (a user bound to
	// system:node-proxier).
	KubeProxy, ProxyKubeconfig string
	// Forward are ports of the machine's loopback the node reaches on its
	// own loopback, and its pods at NodeIP: the API server's, the
	// registry's, a NATS server's.
	Forward []int
	// HostPaths are files and directories of the machine (values) that
	// show at paths of the node (keys) in the node's mount namespace only,
	// as a node's provisioning would have put them there: a libvirtd's
	// socket and guests' consoles, an agent's credentials. A path of the
	// node is under /run (the node's own tmpfs), under /etc (the
	// machine's, with the node's changes on top in Dir), or one the
	// machine has already, which the node's hides, so the machine's files
	// are never written.
	HostPaths map[string]string
	// SandboxImage is the pods' sandbox image (containerd's sandbox_image).
	SandboxImage string
	// Registries are host:port registries containerd pulls from over
	// plain HTTP.
	Registries []string
	// PodSubnet is the node's pods' subnet, in 10.251.0.0/16 but not
	// 10.251.0.0/24; unset, DefaultPodSubnet. Nodes whose pods reach each
	// other (Link) need subnets of their own.
	PodSubnet netip.Prefix
	// Netns, if set, is an existing network namespace (its name under
	// /run/netns) the node joins instead of making its own: a
	// guesthost.Host's, so that the node's pods on the host's network
	// share it with the host's libvirtd, its bridges and its guests, as a
	// hypervisor's kubelet shares the host's. The node adds its address
	// to the namespace and, stopping, kills only its own processes (its
	// cgroup's) and leaves the namespace to its owner.
	Netns string
	// Progress gets a line per step.
	Progress io.Writer
}

// Node is a running kubelet and its containerd.
type Node struct {
	// Name is the Node's name.
	Name string
	// Dir holds the node's configuration, state and logs.
	Dir string
	// Netns is the name of the node's network namespace.
	Netns string
	// NetnsPath is its path.
	NetnsPath string
	// Cgroup is the node's cgroup root (the kubelet's cgroupRoot), a
	// directory of that name in every hierarchy.
	Cgroup string
	// ContainerdSocket is containerd's socket, reachable from here too.
	ContainerdSocket string
	// PodSubnet is Options.PodSubnet, or DefaultPodSubnet.
	PodSubnet netip.Prefix

	rec    record
	lock   *procs.Record
	cmd    *exec.Cmd
	exited chan struct{}
	log    *os.File
	// forwards are Options.Forward's relays and Expose's.
	forwardsMu sync.Mutex
	forwards   []*relay.Relay
	stopped    sync.Once
}

// record is what a node leaves to clean up, in runDir, locked while the
// node's test process lives: a record nobody locks is a killed run's.
type record struct {
	Dir    string `json:"dir"`
	Netns  string `json:"netns"`
	Cgroup string `json:"cgroup"`
	// Joined says the namespace is another's (Options.Netns), which the
	// node's removal leaves.
	Joined bool `json:"joined,omitempty"`
}

// runDir holds the records of the machine's nodes.
func runDir() string { return filepath.Join(os.TempDir(), "virtfleet-kubenode") }

// startScript runs in the node's namespaces: `bash -c startScript kubenode
// DIR PROCS KUBELET [kubelet's flags]`. It moves itself into the node's
// cgroup (PROCS), makes the node's mounts, starts containerd beside, and
// becomes the kubelet once containerd answers, so that containerd, which dies with the kubelet,
// and the kubelet stay in the process group the harness signals.
const startScript = `set -e
d=$1 procs=$2
shift 2
echo $$ >"$procs"
mkdir -p "$d/log"
mount -t tmpfs tmpfs /run
mount --bind "$d/log" /var/log
# The node's /etc is the machine's with the node's own changes on top.
mount -t overlay overlay -o "lowerdir=/etc,upperdir=$d/etc/upper,workdir=$d/etc/work" /etc
while read -r src dst; do
	mkdir -p "$(dirname "$dst")"
	if [ -d "$src" ]; then mkdir -p "$dst"; else touch "$dst"; fi
	mount --bind "$src" "$dst"
done <"$d/hostpaths"
cd "$d/sysctl"
for f in $(find . -type f); do mount --bind "$d/sysctl/$f" "/proc/sys/$f"; done
cd "$d"
setpriv --pdeathsig KILL containerd --config "$d/containerd.toml" >"$d/containerd.log" 2>&1 &
# The kubelet gives up at once on a runtime that does not answer yet.
for i in $(seq 600); do
	if ctr --address "$d/containerd.sock" version >/dev/null 2>&1; then break; fi
	sleep 0.1
done
if [ -s "$d/kube-proxy.args" ]; then
	mapfile -t proxy <"$d/kube-proxy.args"
	setpriv --pdeathsig KILL "${proxy[@]}" >"$d/kube-proxy.log" 2>&1 &
fi
exec "$@"
`

// Start starts a node, first removing what killed runs left behind.
func Start(ctx context.Context, opts Options) (*Node, error) {
	if m := Missing(); len(m) > 0 {
		return nil, errors.Errorf("cannot run a node without %s (run make deps as root)", strings.Join(m, ", "))
	}
	if opts.Progress == nil {
		opts.Progress = io.Discard
	}
	if !opts.PodSubnet.IsValid() {
		opts.PodSubnet = DefaultPodSubnet
	}
	if err := checkPodSubnet(opts.PodSubnet); err != nil {
		return nil, err
	}
	if err := removeLeftovers(ctx, opts.Progress); err != nil {
		return nil, err
	}
	// Not a test's TempDir: a unix socket path must stay under 108 bytes.
	dir, err := os.MkdirTemp("", "vf-kn-")
	if err != nil {
		return nil, errors.Wrap(err, "cannot create the node directory")
	}
	id := strings.TrimPrefix(filepath.Base(dir), "vf-kn-")
	n := &Node{
		Name:             opts.Name,
		Dir:              dir,
		Netns:            cmp.Or(opts.Netns, "vfkn-"+id),
		Cgroup:           "vfkn-" + id,
		ContainerdSocket: filepath.Join(dir, "containerd.sock"),
		PodSubnet:        opts.PodSubnet,
		exited:           make(chan struct{}),
	}
	n.NetnsPath = filepath.Join("/run/netns", n.Netns)
	n.rec = record{Dir: n.Dir, Netns: n.Netns, Cgroup: n.Cgroup, Joined: opts.Netns != ""}
	if err := n.start(ctx, opts); err != nil {
		n.Stop()
		return nil, err
	}
	return n, nil
}

func (n *Node) start(ctx context.Context, opts Options) error {
	var err error
	if n.lock, err = procs.WriteRecord(runDir(), n.rec.Cgroup, n.rec); err != nil {
		return err
	}
	if err := n.writeConfig(opts.SandboxImage, opts.Registries); err != nil {
		return err
	}
	if err := n.writeHostPaths(opts.HostPaths); err != nil {
		return err
	}
	if err := n.writeProxyArgs(opts); err != nil {
		return err
	}
	procs, err := makeCgroups(n.Cgroup)
	if err != nil {
		return err
	}
	if err := n.makeNetns(ctx, !n.rec.Joined); err != nil {
		return err
	}
	for _, p := range opts.Forward {
		f, err := forward(n.NetnsPath, p)
		if err != nil {
			return err
		}
		n.forwards = append(n.forwards, f)
	}
	if n.log, err = os.Create(n.path("kubelet.log")); err != nil {
		return errors.Wrap(err, "cannot create the kubelet's log")
	}
	args := []string{"--net=" + n.NetnsPath, "unshare", "--mount", "--propagation", "private",
		"bash", "-c", startScript, "kubenode", n.Dir, procs,
		opts.Kubelet,
		"--config=" + n.path("kubelet.yaml"),
		"--kubeconfig=" + opts.Kubeconfig,
		"--root-dir=" + n.path("kubelet"),
		"--hostname-override=" + n.Name,
		"--node-ip=" + NodeIP,
	}
	n.cmd = exec.Command("nsenter", args...) //nolint:gosec // the harness's own command line
	n.cmd.Stdout, n.cmd.Stderr = n.log, n.log
	// The parent-death signal reaches the kubelet (nsenter, unshare and
	// bash exec it) if the test binary dies, and containerd with it; the
	// next Start removes the rest.
	n.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := n.cmd.Start(); err != nil {
		return errors.Wrap(err, "cannot start the kubelet")
	}
	go func() { _ = n.cmd.Wait(); close(n.exited) }()
	fmt.Fprintf(opts.Progress, "kubenode: kubelet %s and containerd in network namespace %s, cgroup %s, directory %s\n", n.Name, n.Netns, n.Cgroup, n.Dir)
	return nil
}

// writeHostPaths writes what startScript binds into the node's mount
// namespace, and the directories of the node's /etc.
func (n *Node) writeHostPaths(paths map[string]string) error {
	for _, d := range []string{n.path("etc", "upper"), n.path("etc", "work")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return errors.Wrap(err, "cannot create the node's /etc")
		}
	}
	var lines strings.Builder
	for dst, src := range paths {
		if !strings.HasPrefix(dst, "/run/") && !strings.HasPrefix(dst, "/etc/") {
			if _, err := os.Stat(dst); err != nil {
				return errors.Errorf("host path %s of the node is neither under /run nor under /etc, nor a path the machine has", dst)
			}
		}
		if strings.ContainsAny(dst+src, " \t\n") {
			return errors.Errorf("host path %s or %s has white space", dst, src)
		}
		if _, err := os.Stat(src); err != nil {
			return errors.Wrapf(err, "cannot show %s at the node's %s", src, dst)
		}
		fmt.Fprintf(&lines, "%s %s\n", src, dst)
	}
	return n.write([]byte(lines.String()), "hostpaths")
}

// writeProxyArgs writes kube-proxy's command line, one argument a line,
// for startScript, if the node runs kube-proxy: iptables mode in the
// node's namespace, masquerading every Service's traffic so that a pod's
// reply to another pod of the same bridge comes back through the node
// (the kernel here need not bridge through iptables), and leaving the
// conntrack settings, which are the machine's, as they are.
func (n *Node) writeProxyArgs(opts Options) error {
	if opts.KubeProxy == "" {
		return nil
	}
	args := []string{
		opts.KubeProxy,
		"--kubeconfig=" + opts.ProxyKubeconfig,
		"--hostname-override=" + n.Name,
		"--cluster-cidr=" + clusterCIDR,
		"--proxy-mode=iptables",
		"--masquerade-all",
		"--conntrack-max-per-core=0",
		"--conntrack-tcp-timeout-established=0",
		"--conntrack-tcp-timeout-close-wait=0",
		"--healthz-bind-address=127.0.0.1:10256",
		"--metrics-bind-address=127.0.0.1:10249",
	}
	for _, a := range args {
		if strings.ContainsAny(a, "\n") {
			return errors.Errorf("kube-proxy argument %q has a line break", a)
		}
	}
	return n.write([]byte(strings.Join(args, "\n")+"\n"), "kube-proxy.args")
}

// makeNetns makes the node's network namespace, if create, else joins
// the one it names: loopback up, with the node's address besides
// 127.0.0.1 (the kernel here has no dummy links), and the API server's
// Service range routed to it: a real node's default route would take it,
// and kube-proxy rewrites where it goes, but a connection the kernel has
// no route for fails before kube-proxy's rules see it.
func (n *Node) makeNetns(ctx context.Context, create bool) error {
	steps := [][]string{
		{"-n", n.Netns, "link", "set", "lo", "up"},
		{"-n", n.Netns, "addr", "add", NodeIP + "/32", "dev", "lo"},
		{"-n", n.Netns, "route", "add", controlplane.ServiceRange, "dev", "lo"},
	}
	if create {
		steps = append([][]string{{"netns", "add", n.Netns}}, steps...)
	}
	for _, s := range steps {
		if out, err := exec.CommandContext(ctx, "ip", s...).CombinedOutput(); err != nil {
			return errors.Errorf("cannot make the node's network namespace: ip %s: %v: %s", strings.Join(s, " "), err, out)
		}
	}
	return nil
}

// Exited says whether the kubelet has stopped, and how.
func (n *Node) Exited() error {
	select {
	case <-n.exited:
		return errors.Errorf("the kubelet exited (%s)", n.cmd.ProcessState)
	default:
		return nil
	}
}

// Describe says whether the kubelet runs and how its, containerd's and
// kube-proxy's logs end, for a failed test's output: the logs go with Dir.
func (n *Node) Describe() string {
	state := "running"
	if err := n.Exited(); err != nil {
		state = err.Error()
	}
	return fmt.Sprintf("node %s: kubelet %s\nthe end of the kubelet's log:\n%s\nthe end of containerd's log:\n%s\nthe end of kube-proxy's log, if it runs:\n%s",
		n.Name, state, tail(n.path("kubelet.log")), tail(n.path("containerd.log")), tail(n.path("kube-proxy.log")))
}

func tail(path string) string {
	b, _ := os.ReadFile(path) //nolint:gosec // the node's own log
	if len(b) > 3000 {
		b = b[len(b)-3000:]
	}
	return string(b)
}

// Stop stops the kubelet and containerd, kills every process left in the
// node's cgroup (shims, containers) and namespace, and removes the
// namespace, the cgroups, Dir and the node's record. It may be called
// more than once.
func (n *Node) Stop() { n.stopped.Do(n.stop) }

func (n *Node) stop() {
	if n.cmd != nil && n.cmd.Process != nil {
		guesthost.StopGroup(n.cmd.Process.Pid, n.exited, 15*time.Second)
	}
	n.forwardsMu.Lock()
	for _, f := range n.forwards {
		f.Cut()
	}
	n.forwardsMu.Unlock()
	if n.log != nil {
		_ = n.log.Close()
	}
	if err := remove(context.Background(), n.rec); err != nil {
		fmt.Fprintf(os.Stderr, "kubenode: %v\n", err)
	}
	if n.lock != nil {
		n.lock.Remove()
	}
}

// removeLeftovers removes the nodes of runs that were killed before they
// stopped them: those whose record nobody locks.
func removeLeftovers(ctx context.Context, progress io.Writer) error {
	return procs.RemoveAbandoned(runDir(), func(rec record) error {
		fmt.Fprintf(progress, "kubenode: removing node %s (directory %s) that a killed run left behind\n", rec.Netns, rec.Dir)
		return remove(ctx, rec)
	})
}

// remove kills every process of rec's node, then removes its network
// namespace, its cgroups and its directory.
func remove(ctx context.Context, rec record) error {
	if rec.Cgroup == "" || rec.Netns == "" || !strings.HasPrefix(filepath.Base(rec.Dir), "vf-kn-") {
		return errors.Errorf("the node record %+v is not a node's", rec)
	}
	if !rec.Joined {
		guesthost.KillNetns(rec.Netns)
	}
	if err := killCgroup(ctx, rec.Cgroup); err != nil {
		return err
	}
	if rec.Joined {
		// The namespace's owner removes it; the node's address and route
		// go now, so that a node joining it next can add its own.
		_ = exec.Command("ip", "-n", rec.Netns, "route", "del", controlplane.ServiceRange, "dev", "lo").Run()
		_ = exec.Command("ip", "-n", rec.Netns, "addr", "del", NodeIP+"/32", "dev", "lo").Run()
	} else {
		guesthost.KillNetns(rec.Netns) // what the cgroup did not hold, if anything
		_ = exec.Command("ip", "netns", "del", rec.Netns).Run()
	}
	if err := removeCgroups(rec.Cgroup); err != nil {
		return err
	}
	if os.Getenv("VIRTFLEET_KEEP_KUBE_NODE") != "" {
		return nil
	}
	return errors.Wrapf(os.RemoveAll(rec.Dir), "cannot remove node directory %s", rec.Dir)
}

// killCgroup kills every process in cgroup name of the tracking hierarchy,
// and in its children, until none is left.
func killCgroup(ctx context.Context, name string) error {
	root := filepath.Join(trackingHierarchy(), name)
	var left []int
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		left = cgroupPids(root)
		for _, pid := range left {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		return len(left) == 0, nil
	})
	return errors.Wrapf(err, "processes %v of cgroup %s did not die", left, root)
}

// cgroupPids are the processes in the cgroup at dir and its children.
func cgroupPids(dir string) []int {
	var pids []int
	_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
			return nil //nolint:nilerr // a cgroup removed meanwhile has no processes
		}
		b, _ := os.ReadFile(p) //nolint:gosec // cgroupfs
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil {
				pids = append(pids, pid)
			}
		}
		return nil
	})
	return pids
}
