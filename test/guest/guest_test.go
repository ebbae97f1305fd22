// Package guest runs real guests through the whole stack: the API server,
// NATS, the hub and an agent per libvirt node, each node a real hypervisor — a
// system libvirtd with QEMU (TCG where there is no /dev/kvm) and a NAT network,
// inside a network namespace of the suite's own (internal/harness/guesthost)
// — booting the Debian cloud image built once per machine
// (internal/harness/guestimage). Everything is driven through
// VirtualMachine resources; what the guest really does is checked from inside
// it over ssh, which runs inside its host's namespace. TestRealGuest runs one
// hypervisor, TestTwoHostsOneNetwork two joined by an underlay.
//
// One guest boots several times (about 1–2 minutes per boot on two cores
// without KVM), so the steps run in order and each builds on the last.
package guest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	golibvirt "github.com/digitalocean/go-libvirt"
	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/harness/guesthost"
	"github.com/virtfleet/virtfleet/internal/harness/guestimage"
	"github.com/virtfleet/virtfleet/internal/harness/stack"
)

const (
	ns   = "guests"
	node = "guest1"
	// netCIDR is the VirtualNetwork's subnet: it exists only in the
	// suite's network namespace.
	netCIDR = "10.231.7.0/24"
	// bootTimeout covers an image import and a TCG boot on a busy machine:
	// make test starts this package beside test/e2e's busiest minutes.
	bootTimeout = 12 * time.Minute
	// grace is the agent's ACPI shutdown grace: a clean poweroff must come
	// well before it.
	grace = 3 * time.Minute
)

// suite is what every step shares.
type suite struct {
	t   *testing.T
	ctx context.Context
	s   *stack.Stack
	// hosts are the nodes' hypervisors; host is the one the steps reach
	// guests through (see on).
	hosts map[string]*guesthost.Host
	host  *guesthost.Host
	kube  client.Client
	key   string // private key file
	pub   string // authorized_keys line
}

// TestRealGuest and TestTwoHostsOneNetwork run side by side, each on a
// stack and hosts of its own: their guests' boots take turns under the
// machine's boot lock (booting), and the rest of each, mostly waiting on
// a guest, overlaps the other's.
func TestRealGuest(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Minute)
	defer cancel()
	image := ensureImage(ctx, t)
	suiteStart := time.Now()

	host, err := guesthost.Start(ctx, "vfguest", os.Stderr)
	require.NoError(t, err)
	host.StopWith(t)
	g := startSuite(ctx, t, image, map[string]*guesthost.Host{node: host}).on(node)

	t.Run("NodeHeartbeatsItsHypervisor", g.hypervisor)
	// The first boot ends when getty is on the serial console (see
	// console), after sshd answers.
	booted := guestimage.HoldBoot(ctx, t)
	created := time.Now()
	g.create(vm("g1", g.pub, 1))
	var bootID string
	if !t.Run("RunsWithTheAddressItHoldsAndLetsTheKeyIn", func(t *testing.T) { bootID = g.firstBoot(t, created) }) {
		return // every later step needs a running guest
	}
	t.Run("SwapIsActive", g.swap)
	t.Run("CommandsShareOneSSHConnection", g.sharedSSH("g1"))
	t.Run("SerialConsoleThroughTheAPI", g.console("g1"))
	booted()
	t.Run("VNCThroughTheAPI", g.vnc("g1"))
	t.Run("TheRootVolumeGrowsWhileTheGuestRuns", g.grow("g1", bootID))
	t.Run("ADiskPlugsInAndOutWhileTheGuestRuns", g.hotplug("g1", bootID))
	t.Run("PauseStopsTheGuestAndUnpauseResumesItsBoot", g.pause("g1", bootID))
	t.Run("SnapshotWithMemoryBringsBackTheRunningGuest", g.snapshotWithMemory("g1", bootID))
	t.Run("StopIsAnACPIPoweroffAndStartBootsAgain", booting(ctx, func(t *testing.T) { bootID = g.stopStart(t, bootID) }))
	// Right after the start, in a QEMU process that has run one boot:
	// QEMU 7.2's TCG aborts at a vCPU hot-plug once its running vCPUs
	// have taken every region of its translation cache (an assertion in
	// tcg/region.c), which a reset and a second boot in one process came
	// near enough to crash the guest in CI. KVM has no such cache.
	t.Run("VCPUsAndMemoryChangeLive", func(t *testing.T) { g.resize(t, "g1", bootID, 2, resource.MustParse("1536Mi")) })
	t.Run("ResetRebootsAtOnceAndCountsOnce", booting(ctx, g.reset("g1", &bootID)))
	t.Run("RestartRebootsOnlyThenCountsAndAppliesTheSwap", booting(ctx, func(t *testing.T) { bootID = g.swapAtRestart(t, bootID) }))
	t.Run("DeleteRemovesDomainAndSeedKeepsVolumes", g.delete)
	t.Run("UnbootableRequestFailsWithLibvirtsMessage", g.unbootable)
	t.Logf("suite took %s", time.Since(suiteStart).Round(time.Second))
}

// ensureImage skips where real guests cannot run, and returns the guest
// image, built first if this machine has none.
func ensureImage(ctx context.Context, t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("boots real QEMU guests through the whole stack (minutes); skipped with -short")
	}
	if m := guesthost.Missing(); len(m) > 0 {
		t.Skipf("a real hypervisor needs %v: run make deps as root", m)
	}
	imageStart := time.Now()
	image, err := guestimage.Ensure(ctx, os.Stderr)
	require.NoError(t, err, "cannot build the guest image")
	// On a fresh machine `make test` builds the image beside the other
	// packages, and this waits for it: said apart from the suite's own time.
	t.Logf("guest image ready after %s", time.Since(imageStart).Round(time.Second))
	return image
}

// booting is step holding the machine's guest boot lock
// (guestimage.HoldBoot): a step that boots a guest takes it, and the
// steps between leave it to the other suites' boots.
func booting(ctx context.Context, step func(*testing.T)) func(*testing.T) {
	return func(t *testing.T) {
		defer guestimage.HoldBoot(ctx, t)()
		step(t)
	}
}

// startSuite runs the stack with a libvirt node on each of hosts (by node
// name) and makes what the steps share: the ssh key, the image's server
// and createCommon's resources. options change the stack's Options.
func startSuite(ctx context.Context, t *testing.T, image string, hosts map[string]*guesthost.Host, options ...func(*stack.Options)) *suite {
	t.Helper()
	dir, err := os.MkdirTemp("", "vf-guest-")
	require.NoError(t, err)
	nodes := make([]string, 0, len(hosts))
	libvirtHosts := map[string]stack.LibvirtHost{}
	for n, h := range hosts {
		nodes = append(nodes, n)
		lh := stack.LibvirtHost{Socket: h.Socket, URI: h.URI, Pool: guesthost.Pool, DomainType: guesthost.DomainType, ShutdownGrace: grace, ConsoleLocalDir: h.LibDir("qemu")}
		if h.TunnelAddress != "" {
			// A host on an underlay: the node's overlays go beside
			// libvirtd's bridges, in the host's namespace, and the other
			// host's libvirtd migrates guests to it over the underlay.
			lh.TunnelAddress, lh.Netns, lh.MigrationURI = h.TunnelAddress, h.NetnsPath, h.MigrationURI
		} else {
			// The agent keeps only what cluster/deploy's DaemonSet gives
			// it, so the console steps prove the deployed agent reaches
			// the guests' sockets.
			lh.Capabilities, err = stack.DeployedAgentCapabilities()
			require.NoError(t, err)
		}
		libvirtHosts[n] = lh
	}
	sort.Strings(nodes)
	t.Cleanup(func() {
		if t.Failed() {
			logs := make([]string, 0, len(nodes))
			for _, n := range nodes {
				logs = append(logs, n+": "+hosts[n].LogPath())
			}
			t.Logf("logs kept in %s (libvirtd %s)", filepath.Join(dir, "logs"), strings.Join(logs, ", "))
			return
		}
		_ = os.RemoveAll(dir)
	})
	o := stack.Options{Dir: dir, Nodes: nodes, Progress: os.Stderr, LibvirtHosts: libvirtHosts, Subresources: true}
	for _, change := range options {
		change(&o)
	}
	s, err := stack.Start(ctx, o)
	require.NoError(t, err)
	t.Cleanup(s.Stop)

	g := &suite{t: t, ctx: ctx, s: s, hosts: hosts, kube: s.ControlPlane.Client}
	g.key = filepath.Join(dir, "id_ed25519")
	g.pub, err = guestimage.NewKey(g.key, "virtfleet guest test")
	require.NoError(t, err)
	served, err := guestimage.Serve(image)
	require.NoError(t, err)
	t.Cleanup(served.Close)
	g.createCommon(served.URL, served.SHA256)
	return g
}

// on is the suite reaching guests through node's host: ssh and DHCP leases
// are there.
func (g *suite) on(node string) *suite {
	c := *g
	c.host = g.hosts[node]
	return &c
}

func (g *suite) create(o client.Object) {
	g.t.Helper()
	require.NoError(g.t, g.kube.Create(g.ctx, o))
}

// createCommon makes the namespace, the image, the network and the boot
// volumes.
func (g *suite) createCommon(url, digest string) {
	g.create(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	qcow2 := v1alpha1.DiskFormatQCOW2
	g.create(&v1alpha1.DiskImage{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "debian"},
		Spec: v1alpha1.DiskImageSpec{ForProvider: v1alpha1.DiskImageParameters{
			Source: v1alpha1.DiskImageSource{URL: url, SHA256: digest},
			Format: &qcow2,
		}},
	})
	g.create(&v1alpha1.VirtualNetwork{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "vfnet"},
		Spec:       v1alpha1.VirtualNetworkSpec{ForProvider: v1alpha1.VirtualNetworkParameters{Mode: v1alpha1.NetworkModeNAT, CIDR: netCIDR}},
	})
	for _, name := range []string{"g1-root", "g2-root"} {
		g.create(&v1alpha1.Volume{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: v1alpha1.VolumeSpec{ForProvider: v1alpha1.VolumeParameters{
				Size:   resource.MustParse("4Gi"),
				Source: &v1alpha1.VolumeSource{DiskImageRef: &v1alpha1.LocalReference{Name: "debian"}},
			}},
		})
	}
}

func vm(name, pub string, vcpu int32) *v1alpha1.VirtualMachine {
	swap := resource.MustParse("256Mi")
	return &v1alpha1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1alpha1.VirtualMachineSpec{ForProvider: v1alpha1.VirtualMachineParameters{
			Running:         ptr.To(true),
			Vcpu:            vcpu,
			Memory:          resource.MustParse("1Gi"),
			Swap:            &swap,
			PublicKey:       pub,
			VirtualNetworks: []v1alpha1.LocalName{"vfnet"},
			DiskAttachments: []v1alpha1.DiskAttachment{{Name: v1alpha1.LocalName(name + "-root")}},
		}},
	}
}

func (g *suite) get(t *testing.T, name string) *v1alpha1.VirtualMachine {
	t.Helper()
	v := &v1alpha1.VirtualMachine{}
	require.NoError(t, g.kube.Get(g.ctx, types.NamespacedName{Namespace: ns, Name: name}, v))
	return v
}

// waitVM polls the VM until ok holds.
func (g *suite) waitVM(t *testing.T, name string, timeout time.Duration, what string, ok func(*v1alpha1.VirtualMachine) bool) *v1alpha1.VirtualMachine {
	t.Helper()
	var last v1alpha1.VirtualMachine
	err := wait.PollUntilContextTimeout(g.ctx, time.Second, timeout, true, func(ctx context.Context) (bool, error) {
		v := &v1alpha1.VirtualMachine{}
		if err := g.kube.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, v); err != nil {
			return false, nil
		}
		last = *v
		return ok(v), nil
	})
	// The status is read once the wait is over: it says where the VM stood.
	require.NoError(t, err, "VM %s: %s; last status %+v, conditions %+v", name, what, last.Status.AtProvider, last.Status.Conditions)
	return &last
}

func (g *suite) patch(t *testing.T, name string, change func(*v1alpha1.VirtualMachine)) {
	t.Helper()
	require.Eventually(t, func() bool {
		v := g.get(t, name)
		change(v)
		err := g.kube.Update(g.ctx, v)
		return err == nil || !kerrors.IsConflict(err) && assert.NoError(t, err)
	}, 30*time.Second, 100*time.Millisecond)
}

// address is the VM's reported address on its one network, if any.
func address(v *v1alpha1.VirtualMachine) string {
	for _, i := range v.Status.AtProvider.Interfaces {
		if len(i.IPs) > 0 {
			return i.IPs[0]
		}
	}
	return ""
}

func running(v *v1alpha1.VirtualMachine) bool {
	return v.Status.AtProvider.Phase == v1alpha1.Phase(wire.PhaseRunning)
}

// ssh runs a command in the guest as the image's default user, from inside
// the suite's network namespace.
func (g *suite) ssh(ip, command string) (string, error) {
	return g.host.SSH(g.ctx, g.key, guestimage.DefaultUser, ip, command)
}

// sharedSSH checks that two commands in the guest name came on one
// connection, its client's port the same (guesthost.SSHCommand): the
// steps' many commands cost the emulated guest one login, not one each.
func (g *suite) sharedSSH(name string) func(*testing.T) {
	return func(t *testing.T) {
		ip := address(g.get(t, name))
		first := g.sshUntil(t, ip, "echo $SSH_CONNECTION", time.Minute)
		second := g.sshUntil(t, ip, "echo $SSH_CONNECTION", time.Minute)
		assert.Len(t, strings.Fields(first), 4, "client address and port, server address and port")
		assert.Equal(t, first, second, "one connection")
	}
}

// sshUntil retries ssh until the guest's sshd lets the key in. An emulated
// guest on a busy machine can take long to answer even once it is up.
func (g *suite) sshUntil(t *testing.T, ip, command string, timeout time.Duration) string {
	t.Helper()
	out, err := guesthost.SSHUntil(g.ctx, g.host.Netns, g.key, guestimage.DefaultUser, ip, command, 2*time.Second, timeout)
	require.NoError(t, err, "ssh %s@%s %q for %s: %s", guestimage.DefaultUser, ip, command, timeout, out)
	return out
}

// waitRunningWithAddress waits for Running with an address and for ssh, and
// checks the address is one the guest holds and was leased in this boot,
// that is after since.
func (g *suite) waitRunningWithAddress(t *testing.T, name string, since time.Time) (*v1alpha1.VirtualMachine, string) {
	t.Helper()
	var v *v1alpha1.VirtualMachine
	defer func() {
		if v == nil {
			// The wait failed: what the guest's serial console last said
			// tells a boot that hung from an address never reported.
			t.Logf("%s: the end of its serial console:\n%s", name, g.consoleTail(t, name))
		}
	}()
	v = g.waitVM(t, name, bootTimeout, "Running with an address", func(v *v1alpha1.VirtualMachine) bool {
		return running(v) && address(v) != ""
	})
	t.Logf("%s: Running with address %s %s after the request", name, address(v), time.Since(since).Round(time.Second))
	ip := address(v)
	addrs := g.sshUntil(t, ip, "ip -4 -o addr show scope global", bootTimeout)
	t.Logf("%s: ssh in %s after the request", name, time.Since(since).Round(time.Second))
	assert.Contains(t, addrs, " "+ip+"/", "the reported address is one the guest holds")
	g.assertLeasedSince(t, v, ip, since)
	return v, ip
}

// consoleTail is the last 4 KiB of the serial console log of VM name's
// domain on the guest host.
func (g *suite) consoleTail(t *testing.T, name string) string {
	b, err := os.ReadFile(filepath.Join(g.host.Dir, "log", "qemu", g.domainName(t, name)+"-console.log"))
	if err != nil {
		return err.Error()
	}
	return string(b[max(0, len(b)-4096):])
}

// assertLeasedSince checks the address's DHCP lease was granted after since,
// reading dnsmasq's leases through libvirt.
func (g *suite) assertLeasedSince(t *testing.T, v *v1alpha1.VirtualMachine, ip string, since time.Time) {
	t.Helper()
	l, err := g.host.Dial()
	require.NoError(t, err)
	defer func() { _ = l.Disconnect() }()
	n, err := l.NetworkLookupByName(wire.NameOnNode(ns, "vfnet"))
	require.NoError(t, err)
	leases, _, err := l.NetworkGetDhcpLeases(n, golibvirt.OptString{}, 1, 0)
	require.NoError(t, err)
	mac := v.Status.AtProvider.Interfaces[0].MAC
	for _, lease := range leases {
		if lease.Ipaddr != ip || len(lease.Mac) == 0 || !strings.EqualFold(lease.Mac[0], mac) {
			continue
		}
		// libvirt's networks lease for an hour unless they say otherwise.
		granted := time.Unix(lease.Expirytime, 0).Add(-time.Hour)
		assert.False(t, granted.Before(since.Truncate(time.Second)), "lease of %s granted at %s, before this boot began at %s", ip, granted, since)
		return
	}
	t.Errorf("no lease of %s for %s among %+v", ip, mac, leases)
}

func (g *suite) hypervisor(t *testing.T) {
	hb := g.heartbeat(t)
	assert.Equal(t, guesthost.DomainType, hb.Hypervisor, "the domain type the agent was told to use, whatever /dev/kvm offers")
}

func (g *suite) heartbeat(t *testing.T) wire.NodeHeartbeat {
	t.Helper()
	hb, err := g.s.Heartbeat(g.ctx, node)
	require.NoError(t, err)
	return hb
}

// guestFacts are what a step reads inside the guest.
type guestFacts struct {
	hostname, bootID string
	cpus             int
}

func (g *suite) facts(t *testing.T, ip string) guestFacts {
	t.Helper()
	out := g.sshUntil(t, ip, "hostname; cat /proc/sys/kernel/random/boot_id; nproc", bootTimeout)
	lines := strings.Fields(out)
	require.Len(t, lines, 3, out)
	cpus, err := strconv.Atoi(lines[2])
	require.NoError(t, err)
	return guestFacts{hostname: lines[0], bootID: lines[1], cpus: cpus}
}

func (g *suite) firstBoot(t *testing.T, created time.Time) string {
	v, ip := g.waitRunningWithAddress(t, "g1", created)
	assert.Equal(t, node, v.Status.AtProvider.Node)
	assert.Equal(t, fmt.Sprintf("vfnet(%s)", ip), v.Status.AtProvider.IP)
	f := g.facts(t, ip)
	assert.Equal(t, "g1", f.hostname, "the guest's hostname is the VM's name")
	assert.Equal(t, 1, f.cpus)
	cmdline, err := g.ssh(ip, "cat /proc/cmdline")
	require.NoError(t, err, cmdline)
	assert.Contains(t, strings.Fields(cmdline), "no_timer_check",
		"the image's kernel skips the boot-time timer check a loaded TCG host can fail")
	out, err := exec.CommandContext(g.ctx, g.s.ControlPlane.Kubectl, "--kubeconfig", g.s.ControlPlane.Kubeconfig, "-n", ns, "get", "vm", "g1", "-o", "wide").CombinedOutput()
	require.NoError(t, err, string(out))
	assert.Regexp(t, `(?m)^g1\s+Running\s+0\s+\S+\s+`+node+`\s+vfnet\(`+strings.ReplaceAll(ip, ".", `\.`)+`\)\s+True\s+True$`, string(out))
	return f.bootID
}

func (g *suite) swap(t *testing.T) {
	ip := address(g.get(t, "g1"))
	// /sbin: not on a Debian user's PATH.
	out := g.sshUntil(t, ip, "/sbin/swapon --show=SIZE --bytes --noheadings", 3*time.Minute)
	// The swap disk's first page is mkswap's header.
	assert.Equal(t, strconv.Itoa(256<<20-4096), strings.TrimSpace(out), "the swap disk is formatted and active")
}

// grow raises the size of the VM's root Volume while its guest runs: the
// guest sees the larger disk in the same boot, and the VM neither stops nor
// asks for a restart. It runs before any snapshot: QEMU grows no qcow2 disk
// that holds internal snapshots.
func (g *suite) grow(name, bootID string) func(t *testing.T) {
	return func(t *testing.T) {
		ip := address(g.get(t, name))
		const grown = 5 << 30
		root := &v1alpha1.Volume{}
		require.NoError(t, g.kube.Get(g.ctx, types.NamespacedName{Namespace: ns, Name: name + "-root"}, root))
		require.Less(t, root.Spec.ForProvider.Size.Value(), int64(grown), "the step grows the disk")
		root.Spec.ForProvider.Size = *resource.NewQuantity(grown, resource.BinarySI)
		require.NoError(t, g.kube.Update(g.ctx, root))
		start := time.Now()
		var size string
		require.NoError(t, wait.PollUntilContextTimeout(g.ctx, 2*time.Second, 3*time.Minute, true, func(context.Context) (bool, error) {
			out, err := g.ssh(ip, "lsblk -b -dn -o SIZE /dev/vda")
			size = strings.TrimSpace(out)
			return err == nil && size == strconv.Itoa(grown), nil
		}), "the guest sees its disk at %d bytes; it last said %q", grown, size)
		t.Logf("%s: the guest saw its disk grown %s after the Volume changed", name, time.Since(start).Round(time.Second))
		v := g.waitVM(t, name, time.Minute, "Running, Ready with nothing to say", func(v *v1alpha1.VirtualMachine) bool {
			return running(v) && v.GetCondition(xpv2.TypeReady).Message == ""
		})
		assert.False(t, v.Status.AtProvider.RestartRequired, "a larger disk asks for no restart")
		assert.Equal(t, bootID, g.facts(t, ip).bootID, "the same boot: the disk grew under the running guest")
	}
}

// hotplug attaches a blank Volume to the running guest and detaches it
// again: the guest sees the disk come by the serial the node gives it
// (driver.DiskSerial of its name on the node) and go, the VM's status
// follows, and the guest never reboots.
func (g *suite) hotplug(name, bootID string) func(t *testing.T) {
	return func(t *testing.T) {
		ip := address(g.get(t, name))
		const size = 128 << 20
		data := &v1alpha1.Volume{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-data"},
			Spec:       v1alpha1.VolumeSpec{ForProvider: v1alpha1.VolumeParameters{Size: *resource.NewQuantity(size, resource.BinarySI)}},
		}
		g.create(data)
		serial := driver.DiskSerial(wire.NameOnNode(ns, data.Name))
		// lsblk's SERIAL is udev's ID_SERIAL, the virtio disk's serial. An
		// ssh that fails says neither: the poll asks again.
		var last string
		seen := func() (ok bool, err error) {
			last, err = g.ssh(ip, "lsblk -b -dn -o NAME,SERIAL,SIZE")
			if err != nil {
				return false, err
			}
			for _, line := range strings.Split(last, "\n") {
				if f := strings.Fields(line); len(f) == 3 && f[1] == serial {
					last = line
					return true, nil
				}
			}
			return false, nil
		}
		attached := time.Now()
		g.patch(t, name, func(v *v1alpha1.VirtualMachine) {
			v.Spec.ForProvider.DiskAttachments = append(v.Spec.ForProvider.DiskAttachments, v1alpha1.DiskAttachment{Name: v1alpha1.LocalName(data.Name)})
		})
		err := wait.PollUntilContextTimeout(g.ctx, 2*time.Second, 3*time.Minute, true, func(context.Context) (bool, error) {
			ok, err := seen()
			return err == nil && ok, nil
		})
		require.NoError(t, err, "the guest sees a disk with serial %s; lsblk last said %q", serial, last)
		t.Logf("%s: the guest saw the disk %s after it was attached", name, time.Since(attached).Round(time.Second))
		assert.Equal(t, strconv.Itoa(size), strings.Fields(last)[2], "the guest's disk is the Volume's size")
		v := g.waitVM(t, name, time.Minute, "Running with the disk in its status", func(v *v1alpha1.VirtualMachine) bool {
			return running(v) && slices.Contains(v.Status.AtProvider.Disks, data.Name) && v.Status.AtProvider.ObservedGeneration == v.Generation
		})
		assert.Equal(t, []string{name + "-root", data.Name}, v.Status.AtProvider.Disks, "the boot disk, then the one plugged in")
		assert.False(t, v.Status.AtProvider.RestartRequired, "a disk added at the end asks for no restart: %s", v.GetCondition(xpv2.TypeReady).Message)

		detached := time.Now()
		g.patch(t, name, func(v *v1alpha1.VirtualMachine) {
			v.Spec.ForProvider.DiskAttachments = slices.DeleteFunc(v.Spec.ForProvider.DiskAttachments, func(a v1alpha1.DiskAttachment) bool { return string(a.Name) == data.Name })
		})
		err = wait.PollUntilContextTimeout(g.ctx, 2*time.Second, 3*time.Minute, true, func(context.Context) (bool, error) {
			ok, err := seen()
			return err == nil && !ok, nil
		})
		require.NoError(t, err, "the guest releases the disk with serial %s; lsblk last said %q", serial, last)
		t.Logf("%s: the guest let the disk go %s after it was detached", name, time.Since(detached).Round(time.Second))
		// A disk the running guest still holds keeps it RestartRequired,
		// named, until it lets the disk go.
		v = g.waitVM(t, name, time.Minute, "Running without the disk, nothing waiting for a restart", func(v *v1alpha1.VirtualMachine) bool {
			return running(v) && !v.Status.AtProvider.RestartRequired && v.Status.AtProvider.ObservedGeneration == v.Generation
		})
		assert.Equal(t, []string{name + "-root"}, v.Status.AtProvider.Disks)
		assert.Equal(t, bootID, g.facts(t, ip).bootID, "the same boot: the disk came and went under the running guest")

		g.deleteAndWait(t, data)
		assert.NotContains(t, g.poolVolumes(t), wire.NameOnNode(ns, data.Name), "the deleted Volume's disk is gone from the pool")
	}
}

func (g *suite) domainName(t *testing.T, name string) string {
	v := g.get(t, name)
	return fmt.Sprintf("%s_%s-%s", ns, name, string(v.UID)[:8])
}

func (g *suite) stopStart(t *testing.T, bootID string) string {
	stop := time.Now()
	g.patch(t, "g1", func(v *v1alpha1.VirtualMachine) { v.Spec.ForProvider.Running = ptr.To(false) })
	g.waitVM(t, "g1", grace, "Stopped", func(v *v1alpha1.VirtualMachine) bool {
		return v.Status.AtProvider.Phase == v1alpha1.Phase(wire.PhaseStopped)
	})
	took := time.Since(stop)
	t.Logf("g1: stopped %s after running: false", took.Round(time.Second))
	log, err := g.host.QEMULog(g.domainName(t, "g1"))
	require.NoError(t, err)
	assert.Contains(t, log, "reason=shutdown", "the guest powered itself off")
	assert.NotContains(t, log, "reason=destroyed", "the guest was not forced off")
	assert.Empty(t, address(g.get(t, "g1")), "a stopped guest has no address")

	start := time.Now()
	g.patch(t, "g1", func(v *v1alpha1.VirtualMachine) { v.Spec.ForProvider.Running = ptr.To(true) })
	_, ip := g.waitRunningWithAddress(t, "g1", start)
	f := g.facts(t, ip)
	assert.NotEqual(t, bootID, f.bootID, "a new boot")
	assert.EqualValues(t, 0, g.get(t, "g1").Status.AtProvider.RestartCount, "a stop and a start are no restart")
	return f.bootID
}

// restart asks for a restart of VM name and checks that restartCount
// reaches want only once the guest has booted again.
func (g *suite) restart(t *testing.T, name, bootID string, want int32) string {
	ip := address(g.get(t, name))
	g.patch(t, name, func(v *v1alpha1.VirtualMachine) {
		if v.Annotations == nil {
			v.Annotations = map[string]string{}
		}
		v.Annotations[v1alpha1.AnnotationRestartRequestedAt] = time.Now().Format(time.RFC3339Nano)
	})
	g.waitVM(t, name, bootTimeout, fmt.Sprintf("restartCount %d", want), func(v *v1alpha1.VirtualMachine) bool {
		return v.Status.AtProvider.RestartCount >= want
	})
	// Counted means the old boot is over: the guest is booting or booted
	// anew, never still the one the request found.
	if out, err := g.ssh(ip, "cat /proc/sys/kernel/random/boot_id"); err == nil {
		assert.NotEqual(t, bootID, out, "restartCount went up while the guest still ran its old boot")
	}
	var v *v1alpha1.VirtualMachine
	defer func() {
		if v == nil {
			// The wait failed: what the guest's serial console last said
			// tells a boot that hung from an address never reported.
			t.Logf("%s: the end of its serial console:\n%s", name, g.consoleTail(t, name))
		}
	}()
	v = g.waitVM(t, name, bootTimeout, "Running with an address", func(v *v1alpha1.VirtualMachine) bool {
		return running(v) && address(v) != ""
	})
	assert.Equal(t, want, v.Status.AtProvider.RestartCount, "one restart, counted once")
	f := g.facts(t, address(v))
	assert.NotEqual(t, bootID, f.bootID, "the guest booted again")
	return f.bootID
}

// shape is a guest's vCPUs and memory as the guest itself counts them.
type shape struct {
	cpus int
	// memTotal is /proc/meminfo's MemTotal in bytes: what the kernel was
	// given less what it keeps for itself, so less than the VM's memory.
	memTotal int64
}

// shape reads the vCPUs and memory of the guest at ip.
func (g *suite) shape(t *testing.T, ip string) shape {
	t.Helper()
	out := g.sshUntil(t, ip, "nproc; awk '/^MemTotal:/ {print $2}' /proc/meminfo", time.Minute)
	f := strings.Fields(out)
	require.Len(t, f, 2, out)
	cpus, err := strconv.Atoi(f[0])
	require.NoError(t, err, out)
	kib, err := strconv.ParseInt(f[1], 10, 64)
	require.NoError(t, err, out)
	return shape{cpus: cpus, memTotal: kib << 10}
}

// resize gives the running guest name vcpus and memory within the maximum
// it was defined with, which it takes live, and returns the shape the
// guest then has.
func (g *suite) resize(t *testing.T, name, bootID string, vcpus int32, memory resource.Quantity) shape {
	v := g.get(t, name)
	ip := address(v)
	before := g.shape(t, ip)
	// The balloon gives the guest all of the added memory but what the
	// kernel takes to map it.
	grown := memory.Value() - v.Spec.ForProvider.Memory.Value() - 64<<20
	g.patch(t, name, func(v *v1alpha1.VirtualMachine) {
		v.Spec.ForProvider.Vcpu = vcpus
		v.Spec.ForProvider.Memory = memory
	})
	g.waitVM(t, name, 2*time.Minute, fmt.Sprintf("running with %d vCPUs, no restart required", vcpus), func(v *v1alpha1.VirtualMachine) bool {
		return running(v) && v.Status.AtProvider.Vcpu == vcpus && !v.Status.AtProvider.RestartRequired && v.Status.AtProvider.ObservedGeneration == v.Generation
	})
	var after shape
	require.NoError(t, wait.PollUntilContextTimeout(g.ctx, 2*time.Second, 2*time.Minute, true, func(context.Context) (bool, error) {
		after = g.shape(t, ip)
		return after.cpus == int(vcpus) && after.memTotal-before.memTotal >= grown, nil
	}), "the guest brings its added vCPUs online and the balloon gives it the memory added: from %+v to %+v", before, after)
	assert.Equal(t, bootID, g.facts(t, ip).bootID, "the same boot: vCPUs and memory changed under the running guest")
	return after
}

// swapAtRestart changes the running guest's swap, which applies only at a
// restart, and restarts it (its second restart, after the reset's): the
// restart is counted only once the guest boots again, and the vCPUs given
// live (resize) are the guest's after it. One boot serves both.
func (g *suite) swapAtRestart(t *testing.T, bootID string) string {
	ip := address(g.get(t, "g1"))
	g.patch(t, "g1", func(v *v1alpha1.VirtualMachine) { v.Spec.ForProvider.Swap = ptr.To(resource.MustParse("512Mi")) })
	g.waitVM(t, "g1", time.Minute, "restartRequired", func(v *v1alpha1.VirtualMachine) bool {
		return v.Status.AtProvider.RestartRequired
	})
	assert.Equal(t, bootID, g.facts(t, ip).bootID, "a swap change does not touch the running guest")

	bootID = g.restart(t, "g1", bootID, 2)
	v := g.waitVM(t, "g1", time.Minute, "no restart required", func(v *v1alpha1.VirtualMachine) bool {
		return !v.Status.AtProvider.RestartRequired
	})
	f := g.facts(t, address(v))
	assert.Equal(t, bootID, f.bootID)
	assert.Equal(t, 2, f.cpus, "the vCPUs given live are the guest's after its restart")
	return bootID
}

// poolVolumes lists the names of the volumes in the host's pool.
func (g *suite) poolVolumes(t *testing.T) []string {
	t.Helper()
	l, err := g.host.Dial()
	require.NoError(t, err)
	defer func() { _ = l.Disconnect() }()
	p, err := l.StoragePoolLookupByName(guesthost.Pool)
	require.NoError(t, err)
	// libvirtd refuses to refresh a pool while one of its volumes is
	// being uploaded or downloaded (an image being written, a backup
	// being read): wait for that to end rather than list a stale pool.
	err = wait.PollUntilContextTimeout(g.ctx, 200*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		err := l.StoragePoolRefresh(p, 0)
		if err != nil && strings.Contains(err.Error(), "asynchronous jobs running") {
			return false, nil
		}
		return err == nil, err
	})
	require.NoError(t, err, "refresh of pool %s", guesthost.Pool)
	vols, _, err := l.StoragePoolListAllVolumes(p, 1, 0)
	require.NoError(t, err)
	names := make([]string, 0, len(vols))
	for _, v := range vols {
		names = append(names, v.Name)
	}
	return names
}

func (g *suite) domainExists(t *testing.T, uid types.UID) bool {
	t.Helper()
	l, err := g.host.Dial()
	require.NoError(t, err)
	defer func() { _ = l.Disconnect() }()
	_, err = l.DomainLookupByUUID(golibvirt.UUID(uuid.MustParse(string(uid))))
	return err == nil
}

func (g *suite) delete(t *testing.T) {
	v := g.get(t, "g1")
	require.NoError(t, g.kube.Delete(g.ctx, v))
	require.Eventually(t, func() bool {
		err := g.kube.Get(g.ctx, types.NamespacedName{Namespace: ns, Name: "g1"}, &v1alpha1.VirtualMachine{})
		return kerrors.IsNotFound(err)
	}, 2*time.Minute, time.Second, "the VM is deleted")
	assert.False(t, g.domainExists(t, v.UID), "the domain is gone")
	vols := g.poolVolumes(t)
	for _, name := range vols {
		assert.NotContains(t, name, string(v.UID), "the guest's own volumes (seed, swap) are gone")
	}
	assert.Contains(t, vols, wire.NameOnNode(ns, "g1-root"), "the Volume's disk stays")
	require.NoError(t, g.kube.Get(g.ctx, types.NamespacedName{Namespace: ns, Name: "g1-root"}, &v1alpha1.Volume{}), "the Volume stays")
}

// unbootable asks for UEFI on a host without UEFI firmware: libvirt accepts
// the definition and refuses every start.
func (g *suite) unbootable(t *testing.T) {
	if _, err := os.Stat("/usr/share/OVMF"); err == nil {
		t.Skip("this host has UEFI firmware (OVMF), so a UEFI guest is bootable here")
	}
	v := vm("g2", g.pub, 1)
	uefi := v1alpha1.FirmwareUEFI
	v.Spec.ForProvider.Firmware = &uefi
	asked := time.Now()
	g.create(v)
	v = g.waitVM(t, "g2", bootTimeout, "Failed", func(v *v1alpha1.VirtualMachine) bool {
		return v.Status.AtProvider.Phase == v1alpha1.Phase(wire.PhaseFailed)
	})
	t.Logf("g2: Failed %s after the request (the image import included)", time.Since(asked).Round(time.Second))
	var msg string
	for _, c := range v.Status.Conditions {
		msg += c.Message + "\n"
	}
	assert.Contains(t, msg, "Unable to find any firmware to satisfy 'efi'", "libvirt's own message reaches the user")

	require.NoError(t, g.kube.Delete(g.ctx, v))
	require.Eventually(t, func() bool {
		err := g.kube.Get(g.ctx, types.NamespacedName{Namespace: ns, Name: "g2"}, &v1alpha1.VirtualMachine{})
		return kerrors.IsNotFound(err)
	}, 2*time.Minute, time.Second, "the failed VM is deleted")
	assert.False(t, g.domainExists(t, v.UID))
	for _, name := range g.poolVolumes(t) {
		assert.NotContains(t, name, string(v.UID), "nothing of the failed guest stays in the pool")
	}
}
