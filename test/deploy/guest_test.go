package deploy_test

import (
	"bufio"
	"context"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	computev1alpha1 "github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/harness/controlplane"
	"github.com/virtfleet/virtfleet/internal/harness/guesthost"
	"github.com/virtfleet/virtfleet/internal/harness/guestimage"
	"github.com/virtfleet/virtfleet/internal/harness/manifests"
	"github.com/virtfleet/virtfleet/internal/harness/stack"
)

// guestCIDR is the real guests' VirtualNetwork: it exists only in the
// real host's network namespace, beside the node's pod subnet.
var guestCIDR = netip.MustParsePrefix("10.231.9.0/24")

// bootTimeout covers an image import and a TCG boot on a machine busy
// with the rest of make test.
const bootTimeout = 12 * time.Minute

// realHost is a hypervisor that runs real guests (internal/harness/
// guesthost): a system libvirtd and QEMU in a network namespace of their
// own, which the kubelet node joins, as a hypervisor's kubelet runs on the
// host's network beside its libvirtd's bridges. Its guests boot the image
// of internal/harness/guestimage, served on the machine's loopback at
// imagePort, which the node forwards to its own.
type realHost struct {
	*guesthost.Host
	image     *guestimage.Served
	imagePort int
	// key is the private key file the guests let in as
	// guestimage.DefaultUser; pub its authorized_keys line.
	key, pub string
}

// startRealHost starts a real hypervisor for t, skipping t where one
// cannot run, and builds the guest image first if the machine has none.
func startRealHost(ctx context.Context, t *testing.T) *realHost {
	t.Helper()
	if m := guesthost.Missing(); len(m) > 0 {
		t.Skipf("a real hypervisor needs %v: run make deps as root", m)
	}
	image, err := guestimage.Ensure(ctx, testWriter{t})
	require.NoError(t, err, "cannot build the guest image")
	h, err := guesthost.Start(ctx, "vfdep", testWriter{t})
	require.NoError(t, err)
	h.StopWith(t)
	served, err := guestimage.Serve(image)
	require.NoError(t, err)
	t.Cleanup(served.Close)
	u, err := url.Parse(served.URL)
	require.NoError(t, err)
	port, err := strconv.Atoi(u.Port())
	require.NoError(t, err)
	// Not t.TempDir: ssh's control socket is named after the key's path.
	dir, err := os.MkdirTemp("", "vf-dep-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	r := &realHost{Host: h, image: served, imagePort: port, key: filepath.Join(dir, "id_ed25519")}
	r.pub, err = guestimage.NewKey(r.key, "virtfleet deploy test")
	require.NoError(t, err)
	return r
}

// bootGuest asks for a real guest name as the README's "With Crossplane's
// package manager" tells a user: the image and a NAT network in namespace
// default, then a claim there (package/examples' VirtualMachineClaim, of
// size small, with the key), which Crossplane composes through the XRD
// and virtfleet's function into the VM name and its boot Volume. It waits
// until the VM runs with an address, and the claim shows it, lets the key
// in over ssh at that address and returns the VM and its boot id. It boots
// holding the machine's guest boot lock, as test/guest's boots do: one TCG
// boot at a time.
func (f *fleet) bootGuest(ctx context.Context, t *testing.T, name string) (*computev1alpha1.VirtualMachine, string) {
	t.Helper()
	defer guestimage.HoldBoot(ctx, t)()
	qcow2 := computev1alpha1.DiskFormatQCOW2
	for _, obj := range []client.Object{
		&computev1alpha1.DiskImage{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "debian"},
			Spec: computev1alpha1.DiskImageSpec{ForProvider: computev1alpha1.DiskImageParameters{
				Source: computev1alpha1.DiskImageSource{URL: f.real.image.URL, SHA256: f.real.image.SHA256},
				Format: &qcow2,
			}},
		},
		&computev1alpha1.VirtualNetwork{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "vfnet"},
			Spec:       computev1alpha1.VirtualNetworkSpec{ForProvider: computev1alpha1.VirtualNetworkParameters{Mode: computev1alpha1.NetworkModeNAT, CIDR: guestCIDR.String()}},
		},
		claimOf(t, name, map[string]any{
			"image": "debian", "networks": []any{"vfnet"}, "bootDiskSize": "4Gi", "publicKey": f.real.pub,
		}),
	} {
		require.NoError(t, f.cp.Client.Create(ctx, obj), "%T %s", obj, obj.GetName())
	}
	vm := &computev1alpha1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}}
	err := wait.PollUntilContextTimeout(ctx, time.Second, bootTimeout, true, func(ctx context.Context) (bool, error) {
		if err := f.cp.Client.Get(ctx, client.ObjectKeyFromObject(vm), vm); err != nil {
			return false, client.IgnoreNotFound(err)
		}
		return vm.Status.AtProvider.Phase == computev1alpha1.PhaseRunning && guestAddress(vm) != "", nil
	})
	require.NoError(t, err, "VM %s does not run with an address: %+v", name, vm.Status)
	assert.Equal(t, []computev1alpha1.DiskAttachment{{Name: computev1alpha1.LocalName(name + "-boot")}}, vm.Spec.ForProvider.DiskAttachments, "the claim's boot Volume")
	assert.Equal(t, int32(1), vm.Spec.ForProvider.Vcpu, "size small")
	f.awaitClaim(ctx, t, vm)
	out, err := guesthost.SSHUntil(ctx, f.real.Netns, f.real.key, guestimage.DefaultUser, guestAddress(vm), "cat /proc/sys/kernel/random/boot_id", 2*time.Second, bootTimeout)
	require.NoError(t, err, "ssh to VM %s at %s: %s", name, guestAddress(vm), out)
	return vm, strings.TrimSpace(out)
}

// awaitClaim waits until the claim vm was composed for shows it Running
// at its address.
func (f *fleet) awaitClaim(ctx context.Context, t *testing.T, vm *computev1alpha1.VirtualMachine) {
	t.Helper()
	claim := claimOf(t, vm.Name, nil)
	var status map[string]any
	err := wait.PollUntilContextTimeout(ctx, time.Second, time.Minute, true, func(ctx context.Context) (bool, error) {
		if err := f.cp.Client.Get(ctx, client.ObjectKeyFromObject(claim), claim); err != nil {
			return false, err
		}
		status, _, _ = unstructured.NestedMap(claim.Object, "status")
		return status["phase"] == string(computev1alpha1.PhaseRunning) && status["ip"] == "vfnet("+guestAddress(vm)+")", nil
	})
	require.NoError(t, err, "claim %s does not show its VM Running at %s: %v", vm.Name, guestAddress(vm), status)
}

// claimOf is package/examples' VirtualMachineClaim, named name in
// namespace default, with spec's fields in place of the example's.
func claimOf(t *testing.T, name string, spec map[string]any) *unstructured.Unstructured {
	t.Helper()
	objs, err := manifests.Load(filepath.Join(controlplane.RepoRoot(), "package", "examples", "virtualmachineclaim.yaml"))
	require.NoError(t, err)
	require.Len(t, objs, 1)
	claim := objs[0]
	claim.SetName(name)
	require.Equal(t, "default", claim.GetNamespace())
	for k, v := range spec {
		require.NoError(t, unstructured.SetNestedField(claim.Object, v, "spec", k), k)
	}
	return claim
}

// guestAddress is the first address vm's status gives its guest.
func guestAddress(vm *computev1alpha1.VirtualMachine) string {
	for _, i := range vm.Status.AtProvider.Interfaces {
		if len(i.IPs) > 0 {
			return i.IPs[0]
		}
	}
	return ""
}

// bootID is the boot id of vm's guest, read over ssh.
func (f *fleet) bootID(ctx context.Context, t *testing.T, vm *computev1alpha1.VirtualMachine) string {
	t.Helper()
	out, err := f.real.SSH(ctx, f.real.key, guestimage.DefaultUser, guestAddress(vm), "cat /proc/sys/kernel/random/boot_id")
	require.NoError(t, err, out)
	return out
}

// qemuPID is the process id of the QEMU that runs domain, from the pid
// file libvirtd keeps while it runs.
func (r *realHost) qemuPID(t *testing.T, domain string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(r.Dir, "run", "qemu", domain+".pid"))
	require.NoError(t, err, "libvirtd keeps no pid file for domain %s", domain)
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	require.NoError(t, err)
	require.NoError(t, syscall.Kill(pid, 0), "QEMU %d of domain %s does not run", pid, domain)
	return pid
}

// session is an ssh session to a guest that prints the guest's uptime
// every second until it is ended: it lasts only while the guest runs on
// and its network holds.
type session struct {
	cmd  *exec.Cmd
	done chan struct{}

	mu    sync.Mutex
	lines int
	last  time.Time
}

// openSession opens a session to vm's guest.
func (f *fleet) openSession(ctx context.Context, t *testing.T, vm *computev1alpha1.VirtualMachine) *session {
	t.Helper()
	s := &session{done: make(chan struct{})}
	s.cmd = guesthost.SSHCommand(ctx, f.real.Netns, f.real.key, guestimage.DefaultUser, guestAddress(vm), "while sleep 1; do cat /proc/uptime; done")
	out, err := s.cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, s.cmd.Start())
	go func() {
		defer close(s.done)
		lines := bufio.NewScanner(out)
		for lines.Scan() {
			s.mu.Lock()
			s.lines++
			s.last = time.Now()
			s.mu.Unlock()
		}
		_ = s.cmd.Wait()
	}()
	t.Cleanup(func() { s.end() })
	return s
}

// alive says whether the session still runs and printed lately, and how
// many lines it printed.
func (s *session) alive() (bool, int) {
	select {
	case <-s.done:
		return false, s.lines
	default:
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return time.Since(s.last) < 10*time.Second, s.lines
}

func (s *session) end() {
	if s.cmd.Process != nil {
		_ = s.cmd.Process.Kill()
	}
	<-s.done
}

// startProber pings vm's guest five times a second from a neighbour on
// its network (guesthost's AddNeighbour: a namespace of its own on the
// guest's bridge, as another guest of the network is), and waits for its
// first answer.
func (f *fleet) startProber(ctx context.Context, t *testing.T, vm *computev1alpha1.VirtualMachine) *guesthost.Prober {
	t.Helper()
	neighbour, err := f.real.AddNeighbour(ctx, guestCIDR.Addr().Next(), netip.PrefixFrom(netip.MustParseAddr("10.231.9.250"), guestCIDR.Bits()))
	require.NoError(t, err)
	p, err := guesthost.StartProber(neighbour, guestAddress(vm), 200*time.Millisecond)
	require.NoError(t, err)
	t.Cleanup(p.Stop)
	require.NoError(t, p.WaitAnswer(ctx, time.Now(), time.Minute), "the guest does not answer its neighbour")
	return p
}

// console opens vm's serial console with `kubectl virtfleet console`
// (command makes the kubectl command), through the API server, the
// aggregated API and the agent, and waits for getty's login prompt of the
// guest, whose hostname is the VM's name.
func (f *fleet) console(ctx context.Context, t *testing.T, command func(args ...string) *exec.Cmd, vm *computev1alpha1.VirtualMachine) {
	t.Helper()
	awaitAPIService(ctx, t, f.cp)
	// getty starts on the serial port only after cloud-init's config
	// stage, which under TCG can end minutes after sshd answers.
	out, err := guesthost.SSHUntil(ctx, f.real.Netns, f.real.key, guestimage.DefaultUser, guestAddress(vm), "systemctl is-active serial-getty@ttyS0.service", 2*time.Second, bootTimeout)
	require.NoError(t, err, out)
	c, err := stack.StartConsole(command("virtfleet", "-n", vm.Namespace, "console", vm.Name))
	require.NoError(t, err)
	defer func() { assert.NoError(t, c.Leave(30*time.Second), "the plugin leaves cleanly when its input ends") }()
	_, err = c.AwaitPrompt(ctx, vm.Name, 2*time.Minute)
	require.NoError(t, err, "getty's prompt with the VM's hostname on the console")
}
