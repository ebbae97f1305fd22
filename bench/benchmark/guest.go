package benchmark

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	apisv1alpha1 "github.com/virtfleet/virtfleet/apis/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/harness/guesthost"
	"github.com/virtfleet/virtfleet/internal/harness/guestimage"
	"github.com/virtfleet/virtfleet/internal/harness/stack"
)

// GuestBoot is one real guest's boot through the whole stack: a Debian
// cloud image (internal/harness/guestimage) on a system libvirtd with QEMU
// in a network namespace of the run's own (internal/harness/guesthost),
// running its guests under TCG (guesthost.DomainType).
type GuestBoot struct {
	Node string `json:"node"`
	// Hypervisor is the domain type the node reports: kvm or qemu (TCG).
	Hypervisor  string `json:"hypervisor"`
	VCPU        int32  `json:"vcpu"`
	MemoryBytes int64  `json:"memoryBytes"`
	ImageBytes  int64  `json:"imageBytes"`
	// The DiskImage, its network, the boot Volume and the VM are created
	// together, as a user would: a node imports an image when the first VM
	// that needs it lands there, so the import (fetched from 127.0.0.1,
	// checked, converted) is part of the first boot.
	BootTimes
	// Skipped says why no guest was booted (no hypervisor on this machine).
	Skipped string   `json:"skipped,omitempty"`
	Notes   []string `json:"notes,omitempty"`
}

// BootTimes time one real guest's boot. Every time is from the VM's Create
// call returning to the first poll (every guestPoll) showing: its image on
// the node; phase Running; an address this boot's DHCP lease gave; and the
// first ssh login with the VM's key, from inside the namespace, that finds
// that address in the guest.
type BootTimes struct {
	ImportSeconds          float64 `json:"importSeconds"`
	CreateToRunningSeconds float64 `json:"createToRunningSeconds"`
	CreateToAddressSeconds float64 `json:"createToAddressSeconds"`
	CreateToSSHSeconds     float64 `json:"createToSSHSeconds"`
}

const (
	guestNode      = "guest1"
	guestNamespace = "bench-guest"
	// guestRoot is the first guest's root Volume.
	guestRoot = "guest-root"
	guestCIDR = "10.231.11.0/24"
	guestPoll = 250 * time.Millisecond
	// guestTimeout bounds each wait: an import or a TCG boot on a busy
	// 2-core machine takes minutes.
	guestTimeout = 10 * time.Minute
)

// guestGrants let the guest's namespace download its image from this
// machine's loopback, where guestimage.Serve listens, and back up to and
// restore from the stack's backup location: a tenant may do neither
// unless an administrator allowed it.
var guestGrants = []apisv1alpha1.TenantGrant{{
	Namespaces: []string{guestNamespace}, ImageSources: []string{"127.0.0.0/8"},
	BackupLocations: []string{stack.LocationName},
}}

// runGuest boots one real guest on a stack of its own and times it into
// r.Guest; with o.Snapshots it then snapshots the guest and restores it
// (snapshot.go) into r.Snapshots, and with o.Backups backs it up and
// restores that (backup.go) into r.Backup, on the same stack.
func runGuest(ctx context.Context, o Options, r *Result) error {
	progress := func(format string, args ...any) {
		fmt.Fprintf(o.Progress, "%s %-12s %s\n", time.Now().Format("15:04:05"), "guest", fmt.Sprintf(format, args...))
	}
	g := &GuestBoot{Node: guestNode, VCPU: guestVCPU, MemoryBytes: guestMemoryBytes}
	r.Guest = g
	// skip says, in each section asked for, why it did not run.
	skip := func(why string) {
		if o.Snapshots {
			r.Snapshots = &GuestSnapshots{Skipped: why}
		}
		if o.Backups {
			r.Backup = &GuestBackup{Location: stack.LocationName, Skipped: why}
		}
	}
	if m := guesthost.Missing(); len(m) > 0 {
		g.Skipped = fmt.Sprintf("a real hypervisor needs %v: run make deps as root", m)
		progress("skipped: %s", g.Skipped)
		skip(g.Skipped)
		return nil
	}
	progress("the guest image (built once per machine)")
	image, err := guestimage.Ensure(ctx, o.Progress)
	if err != nil {
		return err
	}
	if fi, err := os.Stat(image); err == nil {
		g.ImageBytes = fi.Size()
	}
	host, err := guesthost.Start(ctx, "vfbench", o.Progress)
	if err != nil {
		return err
	}
	defer host.Stop()
	s, dir, stop, err := startStack(ctx, o, "vf-bench-guest-", stack.Options{
		Nodes: []string{guestNode}, Grants: guestGrants, ObjectStore: o.Backups,
		LibvirtHosts: map[string]stack.LibvirtHost{guestNode: {Socket: host.Socket, URI: host.URI, Pool: guesthost.Pool, DomainType: guesthost.DomainType}},
	}, progress)
	if err != nil {
		return err
	}
	failed := true
	defer func() {
		stop(failed)
		if failed {
			progress("libvirtd's log: %s", host.LogPath())
		}
	}()
	if hb, err := s.Heartbeat(ctx, guestNode); err == nil {
		g.Hypervisor = hb.Hypervisor
	}
	hostOf := func(string) *guesthost.Host { return host }
	if err := bootGuest(ctx, s.ControlPlane.Client, hostOf, image, dir, g, progress); err != nil {
		return err
	}
	if failed = len(g.Notes) > 0; failed {
		skip("the guest did not boot (see its section)")
		return nil
	}
	key := filepath.Join(dir, "id_ed25519")
	if o.Snapshots {
		r.Snapshots = &GuestSnapshots{}
		if err := runSnapshots(ctx, s.ControlPlane.Client, host, key, r.Snapshots, o.Progress); err != nil {
			return errors.Wrap(err, "snapshots")
		}
		failed = len(r.Snapshots.Notes) > 0
	}
	if o.Backups {
		r.Backup = &GuestBackup{Location: stack.LocationName}
		if err := runBackups(ctx, s, hostOf, key, r.Backup, o.Progress); err != nil {
			return errors.Wrap(err, "backups")
		}
		failed = failed || len(r.Backup.Notes) > 0
	}
	return nil
}

// bootGuest creates the guest's VM and what it needs, and times its boot;
// hostOf is the hypervisor of a node, where ssh reaches its guests.
func bootGuest(ctx context.Context, kube client.Client, hostOf func(node string) *guesthost.Host, image, dir string, g *GuestBoot, progress func(string, ...any)) error {
	served, err := guestimage.Serve(image)
	if err != nil {
		return err
	}
	defer served.Close()
	key := filepath.Join(dir, "id_ed25519")
	pub, err := guestimage.NewKey(key, "virtfleet bench guest")
	if err != nil {
		return err
	}
	qcow2 := v1alpha1.DiskFormatQCOW2
	di := &v1alpha1.DiskImage{
		ObjectMeta: metav1.ObjectMeta{Namespace: guestNamespace, Name: "debian"},
		Spec: v1alpha1.DiskImageSpec{ForProvider: v1alpha1.DiskImageParameters{
			Source: v1alpha1.DiskImageSource{URL: served.URL, SHA256: served.SHA256}, Format: &qcow2,
		}},
	}
	vm := guestVM(guestVMName, guestRoot, pub)
	g.VCPU, g.MemoryBytes = vm.Spec.ForProvider.Vcpu, vm.Spec.ForProvider.Memory.Value()
	progress("creating the %.0f MiB image, its network, the boot Volume and the VM", mib(g.ImageBytes))
	for _, obj := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: guestNamespace}},
		&v1alpha1.VirtualNetwork{
			ObjectMeta: metav1.ObjectMeta{Namespace: guestNamespace, Name: "net"},
			Spec:       v1alpha1.VirtualNetworkSpec{ForProvider: v1alpha1.VirtualNetworkParameters{Mode: v1alpha1.NetworkModeNAT, CIDR: guestCIDR}},
		},
		di,
		&v1alpha1.Volume{
			ObjectMeta: metav1.ObjectMeta{Namespace: guestNamespace, Name: guestRoot},
			Spec: v1alpha1.VolumeSpec{ForProvider: v1alpha1.VolumeParameters{
				Size:   resource.MustParse("4Gi"),
				Source: &v1alpha1.VolumeSource{DiskImageRef: &v1alpha1.LocalReference{Name: v1alpha1.LocalName(di.Name)}},
			}},
		},
		vm,
	} {
		if err := kube.Create(ctx, obj); err != nil {
			return errors.Wrapf(err, "cannot create %T %s", obj, obj.GetName())
		}
	}
	if _, note := timeBoot(ctx, kube, hostOf, key, di, vm, time.Now(), &g.BootTimes, progress); note != "" {
		g.Notes = append(g.Notes, note)
	}
	return nil
}

// The size of every real guest the benchmark boots.
const (
	guestVCPU        = 1
	guestMemoryBytes = 1 << 30
)

// guestVM is a real guest's VM, running, booting from Volume disk on the
// network net, that lets key pub in.
func guestVM(name, disk, pub string) *v1alpha1.VirtualMachine {
	return &v1alpha1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Namespace: guestNamespace, Name: name},
		Spec: v1alpha1.VirtualMachineSpec{ForProvider: v1alpha1.VirtualMachineParameters{
			Running:         ptr.To(true),
			Vcpu:            guestVCPU,
			Memory:          *resource.NewQuantity(guestMemoryBytes, resource.BinarySI),
			PublicKey:       pub,
			VirtualNetworks: []v1alpha1.LocalName{"net"},
			DiskAttachments: []v1alpha1.DiskAttachment{{Name: v1alpha1.LocalName(disk)}},
		}},
	}
}

// timeBoot times the boot of vm from image di, both created just before
// created: it polls them until vm is Running with an address, then logs in
// over ssh with key until the guest answers. It returns the address, or
// what failed.
func timeBoot(ctx context.Context, kube client.Client, hostOf func(node string) *guesthost.Host, key string, di *v1alpha1.DiskImage, vm *v1alpha1.VirtualMachine, created time.Time, t *BootTimes, progress func(string, ...any)) (ip, failed string) {
	if err := poll(ctx, func() (bool, error) {
		if t.ImportSeconds == 0 {
			if err := kube.Get(ctx, client.ObjectKeyFromObject(di), di); err != nil {
				return false, err
			}
			if slices.Contains(di.Status.AtProvider.Nodes, guestNode) {
				t.ImportSeconds = time.Since(created).Seconds()
				progress("image on the node after %.1f s", t.ImportSeconds)
			}
		}
		if err := kube.Get(ctx, client.ObjectKeyFromObject(vm), vm); err != nil {
			return false, err
		}
		if t.CreateToRunningSeconds == 0 && vm.Status.AtProvider.Phase == v1alpha1.PhaseRunning {
			t.CreateToRunningSeconds = time.Since(created).Seconds()
			progress("Running after %.1f s", t.CreateToRunningSeconds)
		}
		ip = address(vm)
		return t.CreateToRunningSeconds > 0 && ip != "", nil
	}); err != nil {
		return "", fmt.Sprintf("no address within %s: phase %s, %s; image %s %s", guestTimeout, vm.Status.AtProvider.Phase, vm.GetCondition(xpv2.TypeReady).Message, di.Status.AtProvider.Phase, di.Status.AtProvider.Message)
	}
	t.CreateToAddressSeconds = time.Since(created).Seconds()
	progress("address %s after %.1f s; waiting for ssh", ip, t.CreateToAddressSeconds)

	out, err := guesthost.SSHUntil(ctx, hostOf(vm.Status.AtProvider.Node).Netns, key, guestimage.DefaultUser, ip, "ip -4 -o addr show scope global", guestPoll, guestTimeout)
	if err != nil {
		return ip, fmt.Sprintf("no ssh to %s within %s: %v: %s", ip, guestTimeout, err, out)
	}
	t.CreateToSSHSeconds = time.Since(created).Seconds()
	progress("ssh after %.1f s", t.CreateToSSHSeconds)
	if !strings.Contains(out, " "+ip+"/") {
		return ip, fmt.Sprintf("the guest does not hold the reported address %s: %s", ip, out)
	}
	return ip, ""
}

// address is the first address vm's status shows, or "".
func address(vm *v1alpha1.VirtualMachine) string {
	var ip string
	for _, i := range vm.Status.AtProvider.Interfaces {
		if len(i.IPs) > 0 {
			ip = i.IPs[0]
		}
	}
	return ip
}

func poll(ctx context.Context, done func() (bool, error)) error {
	return wait.PollUntilContextTimeout(ctx, guestPoll, guestTimeout, true, func(context.Context) (bool, error) { return done() })
}

// guestMarkdown renders the real guest's section.
func guestMarkdown(p func(string, ...any), g *GuestBoot) {
	if g == nil {
		return
	}
	p("## One real guest")
	p("")
	if g.Skipped != "" {
		p("Skipped: %s.", g.Skipped)
		p("")
		return
	}
	p("A Debian bookworm cloud image (%.0f MiB qcow2) booted through the whole stack on one node whose libvirtd runs QEMU in a network namespace of its own (domain type `%s`%s), %d vCPU, %.0f MiB. The DiskImage, network, boot Volume and VM are created together, as a user would; the node imports the image (served from 127.0.0.1) for this first VM, so the import is part of the boot. Times are from the VM's Create call, read by polling every %s; ssh logs in with the VM's key from inside the namespace and finds the reported address in the guest.",
		mib(g.ImageBytes), g.Hypervisor, tcg(g.Hypervisor), g.VCPU, mib(g.MemoryBytes), guestPoll)
	p("")
	p("| measure | value |")
	p("| --- | --- |")
	p("| create→image on the node (import) | %s |", seconds(g.ImportSeconds))
	p("| create→Running | %s |", seconds(g.CreateToRunningSeconds))
	p("| create→address | %s |", seconds(g.CreateToAddressSeconds))
	p("| create→ssh | %s |", seconds(g.CreateToSSHSeconds))
	notes(p, g.Notes)
	p("")
}

func tcg(hypervisor string) string {
	if hypervisor == "qemu" {
		return ": TCG, QEMU's own emulation, which the test hypervisor uses whatever /dev/kvm offers"
	}
	return ""
}

func seconds(s float64) string {
	if s == 0 {
		return "–"
	}
	return fmt.Sprintf("%.1f s", s)
}

func milliseconds(ms int64) string {
	if ms == 0 {
		return "–"
	}
	return fmt.Sprintf("%d ms", ms)
}
