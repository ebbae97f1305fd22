package benchmark

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/harness/guesthost"
	"github.com/virtfleet/virtfleet/internal/harness/guestimage"
)

// GuestSnapshots are the real guest of GuestBoot, idle, snapshotted while
// it runs through VirtualMachineSnapshot objects, once of its disks only
// and once with its memory, and brought back to the one with memory by a
// VirtualMachineRestore, while a prober in its host's network namespace
// pings it every pingInterval (guesthost.Prober).
type GuestSnapshots struct {
	PingIntervalSeconds float64 `json:"pingIntervalSeconds"`
	// BaselineGapSeconds is the longest gap between replies over
	// pingBaseline before the first snapshot: what the loaded machine
	// alone does to them.
	BaselineGapSeconds float64         `json:"baselineGapSeconds"`
	DiskOnly           SnapshotRun     `json:"diskOnly"`
	Memory             SnapshotRun     `json:"memory"`
	Restore            SnapshotRestore `json:"restore"`
	// Skipped says why nothing was snapshotted.
	Skipped string   `json:"skipped,omitempty"`
	Notes   []string `json:"notes,omitempty"`
}

// SnapshotRun is one VirtualMachineSnapshot of the running guest.
type SnapshotRun struct {
	Name   string `json:"name"`
	Phase  string `json:"phase"`
	Memory bool   `json:"memory"`
	Frozen bool   `json:"frozen"`
	// PauseSeconds is the longest gap between the prober's replies from
	// the Create call to the first poll showing readyToUse: how long the
	// guest stood still, as another machine on its network sees it.
	PauseSeconds float64 `json:"pauseSeconds"`
	// DurationSeconds is the node's own time (status.durationMilliseconds).
	DurationSeconds float64 `json:"durationSeconds"`
	// CreateToReadySeconds is from the Create call's return to the first
	// poll (every snapshotPoll) showing readyToUse.
	CreateToReadySeconds float64 `json:"createToReadySeconds"`
	// SizeBytes is status.size: how much the guest's qcow2 disks grew,
	// as the node measured it.
	SizeBytes int64 `json:"sizeBytes"`
	// DiskGrowthBytes is how much the root disk's file grew in allocated
	// bytes, read by the benchmark from the host's directory before the
	// Create call and after readyToUse; -1 when it could not be read.
	DiskGrowthBytes int64 `json:"diskGrowthBytes"`
}

// SnapshotRestore is a VirtualMachineRestore of the snapshot with memory
// into its own VM, which runs.
type SnapshotRestore struct {
	Name  string `json:"name"`
	Phase string `json:"phase"`
	// DurationSeconds is the node's own time (status.durationMilliseconds).
	DurationSeconds float64 `json:"durationSeconds"`
	// CreateToRunningSeconds is from the Create call's return to the
	// first poll (every snapshotPoll) showing the restore Succeeded and
	// the VM Running.
	CreateToRunningSeconds float64 `json:"createToRunningSeconds"`
	// PauseSeconds is the longest gap between the prober's replies from
	// the Create call until then, and CreateToAnswerSeconds is from the
	// Create call to the reply that ended it: the guest answering again.
	PauseSeconds          float64 `json:"pauseSeconds"`
	CreateToAnswerSeconds float64 `json:"createToAnswerSeconds"`
	// CreateToSSHSeconds is to the first ssh login (every guestPoll)
	// that reads the guest's boot id.
	CreateToSSHSeconds float64 `json:"createToSSHSeconds"`
	// SameBoot: the guest's boot id after the restore is the one it had
	// before the snapshot, so it was resumed from the snapshot's memory,
	// not booted.
	SameBoot bool `json:"sameBoot"`
}

const (
	// snapshotPoll is how often the benchmark reads a snapshot's or a
	// restore's status: finer than guestPoll, as the targets are seconds.
	snapshotPoll = 100 * time.Millisecond
	// snapshotTimeout bounds one snapshot or restore: KubeVirt's deadline
	// for an online snapshot.
	snapshotTimeout = 5 * time.Minute
	// pingBaseline is how long the prober runs before the first snapshot
	// to show the gaps the machine alone makes.
	pingBaseline = 3 * time.Second
	// answerTimeout bounds the wait for the guest to answer the prober,
	// before the snapshots and after each.
	answerTimeout = time.Minute
)

// The targets for the snapshots of the idle real guest.
const (
	targetDiskOnlyPauseSeconds = 0.2
	targetMemoryTotalSeconds   = 10.0
	targetRestoreSeconds       = 10.0
)

// The names of the snapshots and the restore.
const (
	diskOnlySnapshot = guestVMName + "-disks"
	memorySnapshot   = guestVMName + "-memory"
	snapshotRestore  = guestVMName + "-back"
)

// runSnapshots snapshots runGuest's guest, disk-only and with its memory,
// restores the one with memory, and deletes both snapshots again: a guest
// with snapshots cannot be backed up. What fails along the way is noted
// in sn; an error is the benchmark's own failure, and so is a snapshot
// left behind.
func runSnapshots(ctx context.Context, kube client.Client, host *guesthost.Host, key string, sn *GuestSnapshots, w io.Writer) error {
	progress := func(format string, args ...any) {
		fmt.Fprintf(w, "%s %-12s %s\n", time.Now().Format("15:04:05"), "snapshot", fmt.Sprintf(format, args...))
	}
	note := func(format string, args ...any) {
		sn.Notes = append(sn.Notes, fmt.Sprintf(format, args...))
		progress("%s", sn.Notes[len(sn.Notes)-1])
	}
	sn.PingIntervalSeconds = pingInterval.Seconds()
	vm := &v1alpha1.VirtualMachine{}
	if err := kube.Get(ctx, client.ObjectKey{Namespace: guestNamespace, Name: guestVMName}, vm); err != nil {
		return errors.Wrap(err, "cannot get the guest's VM")
	}
	ip := address(vm)
	hostOf := func(string) *guesthost.Host { return host }
	// A guest still running cloud-init is not idle.
	if _, _, err := settleGuest(ctx, kube, hostOf, key, progress); err != nil {
		note("%v", err)
		return nil
	}
	bootID, err := host.SSH(ctx, key, guestimage.DefaultUser, ip, "cat /proc/sys/kernel/random/boot_id")
	if err != nil {
		note("cannot read the guest's boot id: %v: %s", err, bootID)
		return nil
	}
	disk, err := rootDisk(host)
	if err != nil {
		note("the root disk's file is not read: %v", err)
	}

	progress("pinging %s every %s from inside %s", ip, pingInterval, host.Netns)
	p, err := startProber(host.NetnsPath, ip)
	if err != nil {
		return err
	}
	defer p.Stop()
	baseline, err := baselineGap(ctx, p)
	switch {
	case ctx.Err() != nil:
		return ctx.Err()
	case err != nil:
		note("%v, before any snapshot", err)
		return nil
	}
	sn.BaselineGapSeconds = baseline.Seconds()
	progress("longest gap between replies over %s before any snapshot: %.0f ms", pingBaseline, 1000*sn.BaselineGapSeconds)

	for _, s := range []struct {
		name   string
		memory bool
		run    *SnapshotRun
	}{{diskOnlySnapshot, false, &sn.DiskOnly}, {memorySnapshot, true, &sn.Memory}} {
		progress("snapshot %s (memory: %v)", s.name, s.memory)
		failed, err := takeSnapshot(ctx, kube, p, disk, s.name, s.memory, s.run)
		if err != nil {
			return err
		}
		if failed != "" {
			note("%s", failed)
			return deleteSnapshots(ctx, kube)
		}
		progress("%s: ready %.1f s after its create (node: %.1f s), pause %.0f ms, %.0f MiB (the disk's file grew %.0f MiB), frozen %v",
			s.name, s.run.CreateToReadySeconds, s.run.DurationSeconds, 1000*s.run.PauseSeconds, mib(s.run.SizeBytes), mib(s.run.DiskGrowthBytes), s.run.Frozen)
	}

	progress("restoring %s", memorySnapshot)
	failed, err := restoreSnapshot(ctx, kube, host, key, ip, bootID, p, &sn.Restore)
	if err != nil {
		return err
	}
	if failed != "" {
		note("%s", failed)
	} else {
		progress("restored: Running %.1f s after its create (node: %.1f s), answering after %.1f s (pause %.1f s), ssh after %.1f s, same boot %v",
			sn.Restore.CreateToRunningSeconds, sn.Restore.DurationSeconds, sn.Restore.CreateToAnswerSeconds, sn.Restore.PauseSeconds, sn.Restore.CreateToSSHSeconds, sn.Restore.SameBoot)
	}
	progress("deleting the snapshots")
	return deleteSnapshots(ctx, kube)
}

// takeSnapshot takes the snapshot name of the guest, with its memory or
// not, waits for it to be done while p pings the guest, and fills r; disk
// is the root disk's file, or "". It returns what failed.
func takeSnapshot(ctx context.Context, kube client.Client, p *guesthost.Prober, disk, name string, memory bool, r *SnapshotRun) (failed string, err error) {
	before := allocatedBytes(disk)
	s := &v1alpha1.VirtualMachineSnapshot{
		ObjectMeta: metav1.ObjectMeta{Namespace: guestNamespace, Name: name},
		Spec:       v1alpha1.VirtualMachineSnapshotSpec{VMName: guestVMName, IncludeMemory: memory},
	}
	if err := kube.Create(ctx, s); err != nil {
		return "", errors.Wrapf(err, "cannot create snapshot %s", name)
	}
	created := time.Now()
	r.Name = name
	werr := wait.PollUntilContextTimeout(ctx, snapshotPoll, snapshotTimeout, true, func(ctx context.Context) (bool, error) {
		if err := kube.Get(ctx, client.ObjectKeyFromObject(s), s); err != nil {
			return false, err
		}
		return s.Done(), nil
	})
	ready := time.Now()
	st := s.Status
	r.Phase = string(st.Phase)
	if werr != nil {
		return fmt.Sprintf("snapshot %s not done within %s (%v): %s %s", name, snapshotTimeout, werr, st.Phase, st.Message), nil
	}
	r.CreateToReadySeconds = ready.Sub(created).Seconds()
	r.Memory, r.Frozen = st.Memory, st.Frozen
	r.DurationSeconds = float64(st.DurationMilliseconds) / 1000
	if st.Size != nil {
		r.SizeBytes = st.Size.Value()
	}
	r.DiskGrowthBytes = growthOf(before, allocatedBytes(disk))
	if !st.ReadyToUse {
		return fmt.Sprintf("snapshot %s %s, not ready to use: %s", name, st.Phase, st.Message), nil
	}
	if err := p.WaitAnswer(ctx, ready, answerTimeout); err != nil {
		return fmt.Sprintf("the guest did not answer the prober within %s of snapshot %s", answerTimeout, name), nil
	}
	gap, _, _ := p.Gap(created, ready)
	r.PauseSeconds = gap.Seconds()
	return "", nil
}

// restoreSnapshot restores memorySnapshot into the guest's own VM while p
// pings it, times it to Running, to the guest answering again and to ssh,
// and checks over ssh that the guest kept its boot. It returns what
// failed.
func restoreSnapshot(ctx context.Context, kube client.Client, host *guesthost.Host, key, ip, bootID string, p *guesthost.Prober, r *SnapshotRestore) (failed string, err error) {
	// The guest comes back knowing no connection made since the snapshot.
	guesthost.SSHDisconnect(ctx, host.Netns, key, guestimage.DefaultUser, ip)
	rs := &v1alpha1.VirtualMachineRestore{
		ObjectMeta: metav1.ObjectMeta{Namespace: guestNamespace, Name: snapshotRestore},
		Spec:       v1alpha1.VirtualMachineRestoreSpec{SnapshotName: memorySnapshot},
	}
	if err := kube.Create(ctx, rs); err != nil {
		return "", errors.Wrapf(err, "cannot create restore %s", rs.Name)
	}
	created := time.Now()
	r.Name = rs.Name
	vm := &v1alpha1.VirtualMachine{}
	werr := wait.PollUntilContextTimeout(ctx, snapshotPoll, snapshotTimeout, true, func(ctx context.Context) (bool, error) {
		if err := kube.Get(ctx, client.ObjectKeyFromObject(rs), rs); err != nil {
			return false, err
		}
		if rs.Status.Phase == v1alpha1.RestoreFailed {
			return true, nil
		}
		if err := kube.Get(ctx, client.ObjectKey{Namespace: guestNamespace, Name: guestVMName}, vm); err != nil {
			return false, err
		}
		return rs.Status.Phase == v1alpha1.RestoreSucceeded && vm.Status.AtProvider.Phase == v1alpha1.PhaseRunning, nil
	})
	running := time.Now()
	r.Phase = string(rs.Status.Phase)
	r.DurationSeconds = float64(rs.Status.DurationMilliseconds) / 1000
	switch {
	case werr != nil:
		return fmt.Sprintf("restore %s not Succeeded with the VM Running within %s (%v): restore %s %s, VM %s", rs.Name, snapshotTimeout, werr, rs.Status.Phase, rs.Status.Message, vm.Status.AtProvider.Phase), nil
	case rs.Status.Phase != v1alpha1.RestoreSucceeded:
		return fmt.Sprintf("restore %s %s: %s", rs.Name, rs.Status.Phase, rs.Status.Message), nil
	}
	r.CreateToRunningSeconds = running.Sub(created).Seconds()
	if err := p.WaitAnswer(ctx, running, answerTimeout); err != nil {
		return fmt.Sprintf("the restored guest did not answer the prober within %s", answerTimeout), nil
	}
	gap, ended, _ := p.Gap(created, running)
	r.PauseSeconds, r.CreateToAnswerSeconds = gap.Seconds(), ended.Sub(created).Seconds()
	out, err := guesthost.SSHUntil(ctx, host.Netns, key, guestimage.DefaultUser, ip, "cat /proc/sys/kernel/random/boot_id", guestPoll, guestTimeout)
	if err != nil {
		return fmt.Sprintf("no ssh to the restored guest within %s: %v: %s", guestTimeout, err, out), nil
	}
	r.CreateToSSHSeconds = time.Since(created).Seconds()
	// The id is the last line: anything the login printed comes first.
	lines := strings.Split(strings.TrimSpace(out), "\n")
	r.SameBoot = strings.TrimSpace(lines[len(lines)-1]) == bootID
	if !r.SameBoot {
		return fmt.Sprintf("the restored guest booted: boot id %s, %s before the snapshot", out, bootID), nil
	}
	return "", nil
}

// deleteSnapshots deletes both snapshots, those that were made, and waits
// until they are gone from the node and the API.
func deleteSnapshots(ctx context.Context, kube client.Client) error {
	for _, name := range []string{diskOnlySnapshot, memorySnapshot} {
		s := &v1alpha1.VirtualMachineSnapshot{ObjectMeta: metav1.ObjectMeta{Namespace: guestNamespace, Name: name}}
		if err := kube.Delete(ctx, s); client.IgnoreNotFound(err) != nil {
			return errors.Wrapf(err, "cannot delete snapshot %s", name)
		}
		if err := wait.PollUntilContextTimeout(ctx, snapshotPoll, snapshotTimeout, true, func(ctx context.Context) (bool, error) {
			return kerrors.IsNotFound(kube.Get(ctx, client.ObjectKeyFromObject(s), s)), nil
		}); err != nil {
			return errors.Wrapf(err, "snapshot %s is not gone within %s: %s %s", name, snapshotTimeout, s.Status.Phase, s.Status.Message)
		}
	}
	return nil
}

// rootDisk is the file of the guest's root Volume as this machine sees it:
// the volume of that name in the host's pool, whose directory is
// /var/lib/libvirt/images in the daemon's mount namespace, the host's
// LibDir("images") here.
func rootDisk(host *guesthost.Host) (string, error) {
	path := host.LibDir(filepath.Join("images", wire.NameOnNode(guestNamespace, guestRoot)))
	_, err := os.Stat(path)
	return path, errors.Wrap(err, "cannot read the root disk's file")
}

// allocatedBytes is how much of its file system file takes, or -1 when
// that cannot be read.
func allocatedBytes(file string) int64 {
	var st syscall.Stat_t
	if file == "" || syscall.Stat(file, &st) != nil {
		return -1
	}
	return st.Blocks * 512
}

// growthOf is after less before, or -1 when either is unknown.
func growthOf(before, after int64) int64 {
	if before < 0 || after < 0 {
		return -1
	}
	return after - before
}

// snapshotTargets judge the snapshots and the restore against issue 53's
// targets.
func snapshotTargets(sn *GuestSnapshots) []Target {
	if sn == nil || sn.Skipped != "" {
		return nil
	}
	succeeded, restored := string(v1alpha1.SnapshotSucceeded), string(v1alpha1.RestoreSucceeded)
	d, m, r := sn.DiskOnly, sn.Memory, sn.Restore
	var out []Target
	for _, j := range []struct {
		name, phase, succeeded string
		// got is judged against limit, in seconds; 0 was not measured.
		got, limit float64
		measured   string
	}{
		{"disk-only snapshot of the idle real guest: guest-visible pause (longest ping gap)", d.Phase, succeeded,
			d.PauseSeconds, targetDiskOnlyPauseSeconds, fmt.Sprintf("%.2f s", d.PauseSeconds)},
		{"snapshot with memory of the idle real guest: total, create→readyToUse", m.Phase, succeeded,
			m.CreateToReadySeconds, targetMemoryTotalSeconds, fmt.Sprintf("%.1f s (node: %.1f s)", m.CreateToReadySeconds, m.DurationSeconds)},
		{"restore of the snapshot with memory: create→Running", r.Phase, restored,
			r.CreateToRunningSeconds, targetRestoreSeconds, fmt.Sprintf("%.1f s (guest answers after %.1f s)", r.CreateToRunningSeconds, r.CreateToAnswerSeconds)},
	} {
		if j.phase == "" {
			continue
		}
		out = append(out, Target{
			Name: j.name, Goal: "≤ " + strconv.FormatFloat(j.limit, 'f', -1, 64) + " s", Measured: j.measured,
			Met: j.phase == j.succeeded && j.got > 0 && j.got <= j.limit,
		})
	}
	return out
}

// snapshotMarkdown renders the snapshots' section.
func snapshotMarkdown(p func(string, ...any), sn *GuestSnapshots) {
	if sn == nil {
		return
	}
	p("## Snapshots of the real guest, and a restore")
	p("")
	if sn.Skipped != "" {
		p("Skipped: %s.", sn.Skipped)
		p("")
		return
	}
	p("The guest above, idle once cloud-init is done, snapshotted while it runs through VirtualMachineSnapshot objects: first of its disks only, then with its memory; then a VirtualMachineRestore brings it back to the one with memory. Both are internal qcow2 snapshots. The one with memory is taken by libvirt 9.0 with QEMU's savevm, which stops the guest while its memory and device state are written into the qcow2 disk. The disk-only one is taken by QEMU while the guest runs (one QMP transaction of blockdev-snapshot-internal-sync over its disks), with its filesystems frozen by the guest agent, and recorded in libvirt as a snapshot of its disks alone. Meanwhile the benchmark sends an ICMP echo request to the guest every %.0f ms from a raw socket in the guest's network namespace (golang.org/x/net/icmp): the pause is the longest time between two replies from the snapshot's Create call until it is readyToUse, or for the restore until it Succeeded with the VM Running; over %s before the first snapshot the longest was %.0f ms, which is the loaded machine's own noise. Times are from the Create call, read by polling every %s; durations and sizes are the node's own (the status); the disk's file growth is the root qcow2's allocated bytes, read by the benchmark before and after.",
		1000*sn.PingIntervalSeconds, pingBaseline, 1000*sn.BaselineGapSeconds, snapshotPoll)
	p("")
	d, m := sn.DiskOnly, sn.Memory
	growth := func(b int64) string {
		if b < 0 {
			return "–"
		}
		return fmt.Sprintf("%.1f MiB", mib(b))
	}
	gap := func(s float64) string {
		if s == 0 {
			return "–"
		}
		return fmt.Sprintf("%.0f ms", 1000*s)
	}
	p("| measure | disk-only | with memory | target |")
	p("| --- | --- | --- | --- |")
	p("| phase | %s | %s | |", orDash(d.Phase), orDash(m.Phase))
	p("| filesystems frozen by the guest agent | %s | %s | |", yesNo(d.Frozen), yesNo(m.Frozen))
	p("| holds the guest's memory (status) | %s | %s | |", yesNo(d.Memory), yesNo(m.Memory))
	p("| guest-visible pause (longest ping gap) | %s | %s | disk-only ≤ %.1f s |", gap(d.PauseSeconds), gap(m.PauseSeconds), targetDiskOnlyPauseSeconds)
	p("| duration on the node (status) | %s | %s | |", seconds(d.DurationSeconds), seconds(m.DurationSeconds))
	p("| create→readyToUse, seen by the benchmark | %s | %s | with memory ≤ %.0f s |", seconds(d.CreateToReadySeconds), seconds(m.CreateToReadySeconds), targetMemoryTotalSeconds)
	p("| bytes written: status.size (qcow2 growth, node) | %.1f MiB | %.1f MiB | |", mib(d.SizeBytes), mib(m.SizeBytes))
	p("| bytes written: root disk file's growth (benchmark) | %s | %s | |", growth(d.DiskGrowthBytes), growth(m.DiskGrowthBytes))
	p("")
	r := sn.Restore
	p("The restore of the snapshot with memory into its own running VM (libvirt reverts the running domain to it and resumes it):")
	p("")
	p("| measure | value | target |")
	p("| --- | --- | --- |")
	p("| phase | %s | |", orDash(r.Phase))
	p("| duration on the node (status) | %s | |", seconds(r.DurationSeconds))
	p("| create→Succeeded and the VM Running | %s | ≤ %.0f s |", seconds(r.CreateToRunningSeconds), targetRestoreSeconds)
	p("| guest-visible pause (longest ping gap) | %s | |", gap(r.PauseSeconds))
	p("| create→the guest answers again (the reply ending that gap) | %s | |", seconds(r.CreateToAnswerSeconds))
	p("| create→ssh | %s | |", seconds(r.CreateToSSHSeconds))
	p("| the same boot as before the snapshot (resumed, not booted) | %s | |", yesNo(r.SameBoot))
	p("")
	p("Beside: vSphere stuns a VM for about 0.2 s to snapshot it; KubeVirt gives an online snapshot 5 minutes (its default failure deadline) and keeps no memory. Here the guest runs under TCG on a loaded 2-core machine, and savevm stops it for as long as writing its state takes.")
	notes(p, sn.Notes)
	p("")
}
