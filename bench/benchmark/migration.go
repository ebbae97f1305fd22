package benchmark

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/harness/guesthost"
	"github.com/virtfleet/virtfleet/internal/harness/guestimage"
	"github.com/virtfleet/virtfleet/internal/harness/stack"
)

// MigrationRun is the live migration of one idle real guest between two
// hypervisors through the whole stack: a VirtualMachineMigration, the hub
// choosing the other node, the source's libvirtd copying memory and the
// boot disk to the target's over the hosts' underlay (a veth pair between
// two network namespaces, guesthost.StartPair).
type MigrationRun struct {
	Boot GuestBoot `json:"boot"`
	// DiskBytes is the guest's boot Volume's size.
	DiskBytes int64 `json:"diskBytes"`
	// RequestToSucceededSeconds is from the migration's Create call to the
	// first poll showing it Succeeded; RequestToNodeSeconds to the VM's
	// status naming the target node.
	RequestToSucceededSeconds float64 `json:"requestToSucceededSeconds"`
	RequestToNodeSeconds      float64 `json:"requestToNodeSeconds"`
	// TotalSeconds, DowntimeMilliseconds and TransferredBytes are what
	// libvirt reported of its migration job on the source.
	TotalSeconds         float64 `json:"totalSeconds"`
	DowntimeMilliseconds int64   `json:"downtimeMilliseconds"`
	TransferredBytes     int64   `json:"transferredBytes"`
	// NeighbourGapMilliseconds is the longest time between two echo
	// replies of the guest to a prober on the source host's network,
	// which reaches it over the overlay once it moved, from the
	// migration's request until it Succeeded; BaselineGapMilliseconds the
	// longest before the migration, the machine's own noise.
	NeighbourGapMilliseconds int64 `json:"neighbourGapMilliseconds"`
	// NeighbourGapEndSeconds is when the longest gap ended, from the
	// request: beside RequestToSucceededSeconds and TotalSeconds it says
	// whether the gap was the switch-over or the copy before it.
	NeighbourGapEndSeconds  float64  `json:"neighbourGapEndSeconds"`
	BaselineGapMilliseconds int64    `json:"baselineGapMilliseconds"`
	Skipped                 string   `json:"skipped,omitempty"`
	Notes                   []string `json:"notes,omitempty"`
}

// Issue 57's target for a live migration as the guest's neighbours see
// it: the longest gap at most this long, and at most this many times
// libvirt's own downtime.
const (
	targetNeighbourGapMilliseconds = 300
	targetNeighbourGapOfDowntime   = 1.5
)

// The migration scenario's two nodes.
var migrationNodes = [2]string{"hv-a", "hv-b"}

// runMigration boots one guest on a stack of two real hypervisors, lets it
// settle, and migrates it to the other node.
func runMigration(ctx context.Context, o Options) (*MigrationRun, error) {
	progress := func(format string, args ...any) {
		fmt.Fprintf(o.Progress, "%s %-12s %s\n", time.Now().Format("15:04:05"), "migration", fmt.Sprintf(format, args...))
	}
	m := &MigrationRun{Boot: GuestBoot{VCPU: 1, MemoryBytes: 1 << 30}, DiskBytes: 4 << 30}
	if miss := guesthost.Missing(); len(miss) > 0 {
		m.Skipped = fmt.Sprintf("a real hypervisor needs %v: run make deps as root", miss)
		progress("skipped: %s", m.Skipped)
		return m, nil
	}
	image, err := guestimage.Ensure(ctx, o.Progress)
	if err != nil {
		return nil, err
	}
	if fi, err := os.Stat(image); err == nil {
		m.Boot.ImageBytes = fi.Size()
	}
	pair, err := guesthost.StartPair(ctx, "vfbmig", o.Progress)
	if err != nil {
		return nil, err
	}
	defer pair.Close()
	hosts := map[string]stack.LibvirtHost{}
	for i, h := range pair.Hosts() {
		hosts[migrationNodes[i]] = stack.LibvirtHost{Socket: h.Socket, URI: h.URI, Pool: guesthost.Pool, DomainType: guesthost.DomainType,
			TunnelAddress: h.TunnelAddress, Netns: h.NetnsPath, MigrationURI: h.MigrationURI}
	}
	s, dir, stop, err := startStack(ctx, o, "vf-bench-migration-", stack.Options{Nodes: migrationNodes[:], LibvirtHosts: hosts, Grants: guestGrants}, progress)
	if err != nil {
		return nil, err
	}
	failed := true
	defer func() { stop(failed) }()
	if hb, err := s.Heartbeat(ctx, migrationNodes[0]); err == nil {
		m.Boot.Hypervisor = hb.Hypervisor
	}
	hostOf := func(node string) *guesthost.Host {
		if node == migrationNodes[1] {
			return pair.B
		}
		return pair.A
	}
	if err := bootGuest(ctx, s.ControlPlane.Client, hostOf, image, dir, &m.Boot, progress); err != nil {
		return nil, err
	}
	if len(m.Boot.Notes) > 0 {
		m.Notes = append(m.Notes, m.Boot.Notes...)
		return m, nil
	}
	ip, node, err := settleGuest(ctx, s.ControlPlane.Client, hostOf, filepath.Join(dir, "id_ed25519"), progress)
	if err != nil {
		m.Notes = append(m.Notes, err.Error())
		return m, nil
	}
	// A neighbour on the guest's network beside the source: it reaches the
	// guest over the overlay once the guest moved. A node keeps a network
	// only while a guest of its has an interface on it, so a stopped VM
	// keeps it on the source. The neighbour has the network's last
	// address, which the hub hands out last.
	if err := anchorNetwork(ctx, s.ControlPlane.Client, node); err != nil {
		m.Notes = append(m.Notes, err.Error())
		return m, nil
	}
	network := netip.MustParsePrefix(guestCIDR).Masked()
	last := lastHost(network)
	neighbour, err := hostOf(node).AddNeighbour(ctx, network.Addr().Next(), netip.PrefixFrom(last, network.Bits()))
	if err != nil {
		return nil, err
	}
	progress("pinging %s every %s from %s, a neighbour on %s's network", ip, pingInterval, last, node)
	p, err := startProber(neighbour, ip)
	if err != nil {
		return nil, err
	}
	defer p.Stop()
	baseline, err := baselineGap(ctx, p)
	switch {
	case ctx.Err() != nil:
		return nil, ctx.Err()
	case err != nil:
		m.Notes = append(m.Notes, err.Error()+", before the migration")
		return m, nil
	}
	m.BaselineGapMilliseconds = baseline.Milliseconds()
	asked, done, err := migrateGuest(ctx, s.ControlPlane.Client, m, progress)
	if err != nil {
		return nil, err
	}
	if !done.IsZero() {
		if err := p.WaitAnswer(ctx, done, answerTimeout); err != nil {
			m.Notes = append(m.Notes, fmt.Sprintf("the guest did not answer its neighbour within %s of the migration's end", answerTimeout))
		} else if gap, ended, ok := p.Gap(asked, done); ok {
			m.NeighbourGapMilliseconds, m.NeighbourGapEndSeconds = gap.Milliseconds(), ended.Sub(asked).Seconds()
			progress("longest gap between the guest's replies to its neighbour: %d ms, ended %.2f s after the request, %.2f s before the migration was seen Succeeded (%d ms before the migration)",
				m.NeighbourGapMilliseconds, m.NeighbourGapEndSeconds, done.Sub(ended).Seconds(), m.BaselineGapMilliseconds)
		}
	}
	failed = len(m.Notes) > 0
	return m, nil
}

// settleGuest waits for cloud-init to finish in bootGuest's guest, so the
// guest that moves is an idle one, and returns its address and node.
func settleGuest(ctx context.Context, kube client.Client, hostOf func(string) *guesthost.Host, key string, progress func(string, ...any)) (ip, node string, err error) {
	vm := &v1alpha1.VirtualMachine{}
	if err := kube.Get(ctx, client.ObjectKey{Namespace: guestNamespace, Name: "guest"}, vm); err != nil {
		return "", "", errors.Wrap(err, "cannot get the guest's VM")
	}
	for _, i := range vm.Status.AtProvider.Interfaces {
		if len(i.IPs) > 0 {
			ip = i.IPs[0]
		}
	}
	var out string
	err = poll(ctx, func() (bool, error) {
		// Over, whether done or with an error (the image's cloud-init
		// fails its locale module): it runs no more.
		out, _ = hostOf(vm.Status.AtProvider.Node).SSH(ctx, key, guestimage.DefaultUser, ip, "cloud-init status")
		return strings.HasPrefix(out, "status: done") || strings.HasPrefix(out, "status: error"), nil
	})
	if err != nil {
		return "", "", errors.Errorf("cloud-init did not finish in the guest within %s: %s", guestTimeout, out)
	}
	progress("the guest is idle (cloud-init done)")
	return ip, vm.Status.AtProvider.Node, nil
}

// migrateGuest migrates bootGuest's VM to the node it is not on, and
// returns when it was asked for and when it was seen Succeeded with the
// VM on the target (zero when it did not succeed).
func migrateGuest(ctx context.Context, kube client.Client, m *MigrationRun, progress func(string, ...any)) (asked, done time.Time, err error) {
	vm := &v1alpha1.VirtualMachine{}
	key := client.ObjectKey{Namespace: guestNamespace, Name: "guest"}
	if err := kube.Get(ctx, key, vm); err != nil {
		return asked, done, errors.Wrap(err, "cannot get the guest's VM")
	}
	from := vm.Status.AtProvider.Node
	to := migrationNodes[0]
	if from == to {
		to = migrationNodes[1]
	}
	mig := &v1alpha1.VirtualMachineMigration{
		ObjectMeta: metav1.ObjectMeta{Namespace: guestNamespace, Name: "guest-away"},
		Spec:       v1alpha1.VirtualMachineMigrationSpec{VMName: "guest"},
	}
	progress("migrating the idle guest from %s to %s", from, to)
	if err := kube.Create(ctx, mig); err != nil {
		return asked, done, errors.Wrap(err, "cannot create the migration")
	}
	asked = time.Now()
	if err := poll(ctx, func() (bool, error) {
		if m.RequestToNodeSeconds == 0 {
			if err := kube.Get(ctx, key, vm); err != nil {
				return false, err
			}
			if vm.Status.AtProvider.Node == to {
				m.RequestToNodeSeconds = time.Since(asked).Seconds()
			}
		}
		if err := kube.Get(ctx, client.ObjectKeyFromObject(mig), mig); err != nil {
			return false, err
		}
		if mig.Done() && m.RequestToSucceededSeconds == 0 {
			m.RequestToSucceededSeconds = time.Since(asked).Seconds()
		}
		return mig.Done() && m.RequestToNodeSeconds > 0, nil
	}); err != nil {
		m.Notes = append(m.Notes, fmt.Sprintf("not migrated within %s: %s %s", guestTimeout, mig.Status.Phase, mig.Status.Message))
		return asked, done, nil
	}
	if mig.Status.Phase != v1alpha1.MigrationSucceeded {
		m.Notes = append(m.Notes, fmt.Sprintf("the migration failed: %s", mig.Status.Message))
		return asked, done, nil
	}
	done = time.Now()
	st := mig.Status
	if st.StartTime != nil && st.EndTime != nil {
		m.TotalSeconds = st.EndTime.Sub(st.StartTime.Time).Seconds()
	}
	m.DowntimeMilliseconds, m.TransferredBytes = st.DowntimeMilliseconds, st.TransferredBytes
	progress("migrated in %.1f s (libvirt), downtime %d ms, %.0f MiB transferred; request→Succeeded %.1f s",
		m.TotalSeconds, m.DowntimeMilliseconds, mib(m.TransferredBytes), m.RequestToSucceededSeconds)
	return asked, done, nil
}

// anchorNetwork makes a stopped VM on the guest's network on node, and
// waits until node has defined it: the network stays on node while its
// guest is away.
func anchorNetwork(ctx context.Context, kube client.Client, node string) error {
	vol := &v1alpha1.Volume{
		ObjectMeta: metav1.ObjectMeta{Namespace: guestNamespace, Name: "anchor-root"},
		Spec:       v1alpha1.VolumeSpec{ForProvider: v1alpha1.VolumeParameters{Size: resource.MustParse("64Mi")}},
	}
	vm := &v1alpha1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Namespace: guestNamespace, Name: "anchor"},
		Spec: v1alpha1.VirtualMachineSpec{ForProvider: v1alpha1.VirtualMachineParameters{
			Running: ptr.To(false), Vcpu: 1, Memory: resource.MustParse("128Mi"),
			NodeSelector:    map[string]string{"kubernetes.io/hostname": node},
			VirtualNetworks: []v1alpha1.LocalName{"net"},
			DiskAttachments: []v1alpha1.DiskAttachment{{Name: v1alpha1.LocalName(vol.Name)}},
		}},
	}
	for _, o := range []client.Object{vol, vm} {
		if err := kube.Create(ctx, o); err != nil {
			return errors.Wrapf(err, "cannot create the network's anchor %s", o.GetName())
		}
	}
	err := poll(ctx, func() (bool, error) {
		if err := kube.Get(ctx, client.ObjectKeyFromObject(vm), vm); err != nil {
			return false, nil //nolint:nilerr // read again
		}
		if at := vm.Status.AtProvider; at.Phase == v1alpha1.PhaseFailed {
			return false, errors.Errorf("the network's anchor VM failed: %s", vm.GetCondition(xpv2.TypeReady).Message)
		}
		return vm.Status.AtProvider.Phase == v1alpha1.PhaseStopped && vm.Status.AtProvider.Node == node, nil
	})
	return errors.Wrapf(err, "the network's anchor VM is not Stopped on %s: %s", node, vm.Status.AtProvider.Phase)
}

// lastHost is the last address of the IPv4 network p before its
// broadcast address.
func lastHost(p netip.Prefix) netip.Addr {
	a := p.Masked().Addr().As4()
	binary.BigEndian.PutUint32(a[:], binary.BigEndian.Uint32(a[:])|(1<<(32-p.Bits())-2))
	return netip.AddrFrom4(a)
}

// migrationTargets judge the migration as its guest's neighbour saw it
// against issue 57's target; one not measured is not judged.
func migrationTargets(m *MigrationRun) []Target {
	if m == nil || m.Skipped != "" || m.NeighbourGapMilliseconds == 0 {
		return nil
	}
	limit := min(targetNeighbourGapMilliseconds, targetNeighbourGapOfDowntime*float64(m.DowntimeMilliseconds))
	return []Target{{
		Name:     "live migration of the idle real guest: longest gap a neighbour sees (echo every 10 ms, from the source's network)",
		Goal:     fmt.Sprintf("≤ %d ms and ≤ %.1f× libvirt's downtime", targetNeighbourGapMilliseconds, targetNeighbourGapOfDowntime),
		Measured: fmt.Sprintf("%d ms (libvirt's downtime %d ms; %d ms before the migration)", m.NeighbourGapMilliseconds, m.DowntimeMilliseconds, m.BaselineGapMilliseconds),
		Met:      float64(m.NeighbourGapMilliseconds) <= limit,
	}}
}

// migrationMarkdown renders the live migration's section.
func migrationMarkdown(p func(string, ...any), m *MigrationRun) {
	if m == nil {
		return
	}
	p("## Live migration of an idle real guest")
	p("")
	if m.Skipped != "" {
		p("Skipped: %s.", m.Skipped)
		p("")
		return
	}
	p("One Debian guest (%d vCPU, %.0f MiB, domain type `%s`%s) booted on one of two hypervisors, each a libvirtd in a network namespace of its own joined by a veth underlay, then moved with a VirtualMachineMigration: the hub chooses the other node, the source's libvirtd copies memory and the %.0f GiB boot Volume (qcow2 over the image) to the target's, peer to peer, while the guest runs. Total, downtime and bytes are libvirt's own figures for its migration job; the request times are from the migration's Create call, read by polling every %s. A neighbour on the guest's network beside the source (a network namespace joined to the source's bridge, which a stopped VM keeps there) sends the guest an ICMP echo request every 10 ms, and reaches it over the overlay once it moved.",
		m.Boot.VCPU, mib(m.Boot.MemoryBytes), m.Boot.Hypervisor, tcg(m.Boot.Hypervisor), float64(m.DiskBytes)/(1<<30), guestPoll)
	p("")
	p("| measure | value |")
	p("| --- | --- |")
	p("| migration total (libvirt) | %s |", seconds(m.TotalSeconds))
	p("| downtime (libvirt) | %d ms |", m.DowntimeMilliseconds)
	p("| longest gap between the guest's echo replies to a neighbour on the source's network (every %.0f ms) | %s, ending %s after the request (%d ms before the migration) |",
		float64(pingInterval.Milliseconds()), milliseconds(m.NeighbourGapMilliseconds), seconds(m.NeighbourGapEndSeconds), m.BaselineGapMilliseconds)
	p("| transferred (memory and disk) | %.0f MiB |", mib(m.TransferredBytes))
	p("| request→Succeeded | %s |", seconds(m.RequestToSucceededSeconds))
	p("| request→VM's node is the target | %s |", seconds(m.RequestToNodeSeconds))
	p("")
	p("Beside: OpenStack Nova's measured 4.9 s total and 0.7 s downtime for an idle 512 MB guest over 1 GbE with shared storage (500 ms downtime default); KubeVirt caps downtime at 0.15–0.9 s. Here the disk is copied too, and the guest runs under TCG.")
	notes(p, m.Notes)
	p("")
}
