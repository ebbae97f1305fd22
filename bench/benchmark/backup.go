package benchmark

import (
	"context"
	crand "crypto/rand"
	"crypto/sha256"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/minio/minio-go/v7"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/harness/guesthost"
	"github.com/virtfleet/virtfleet/internal/harness/guestimage"
	"github.com/virtfleet/virtfleet/internal/harness/s3test"
	"github.com/virtfleet/virtfleet/internal/harness/stack"
)

// GuestBackup is the real guest of GuestBoot backed up while it runs, whole
// and then incrementally, to a BackupLocation on an S3 server of the same
// stack (SeaweedFS on this machine), beside a raw upload of as many bytes
// to the same bucket; and a VM made again from the incremental backup.
type GuestBackup struct {
	// Location is the BackupLocation, stack.LocationName.
	Location string `json:"location"`
	// DiskBytes is the size of the guest's disk as the full backup
	// reports it (status.size).
	DiskBytes int64 `json:"diskBytes"`
	// Full is the VM's first backup, which reads its disk whole.
	Full BackupRun `json:"full"`
	// Raw is the baseline: what the full backup read, as random bytes,
	// uploaded by the benchmark to the same bucket right after it.
	Raw RawUpload `json:"raw"`
	// GuestWrittenBytes of random data the guest wrote and synced between
	// the two backups; GuestWriteSeconds from the ssh command that started
	// the write to the first login (every guestWritePoll) finding it done.
	GuestWrittenBytes int64   `json:"guestWrittenBytes"`
	GuestWriteSeconds float64 `json:"guestWriteSeconds"`
	// Incremental is the second backup, which reads only what changed.
	Incremental BackupRun `json:"incremental"`
	// IncrementalReadOfWritten is the incremental backup's BytesRead over
	// GuestWrittenBytes.
	IncrementalReadOfWritten float64 `json:"incrementalReadOfWritten"`
	// FullOfRaw and IncrementalOfRaw are each backup's read throughput
	// over the raw upload's throughput, judged against
	// targetBackupOfRaw.
	FullOfRaw        float64 `json:"fullOfRaw"`
	IncrementalOfRaw float64 `json:"incrementalOfRaw"`
	// StopSeconds is from the guest's spec.running set false to the first
	// poll showing it Stopped: it gives the machine its CPU back before
	// the restore.
	StopSeconds float64 `json:"stopSeconds"`
	// Restore is a VM made from the incremental backup.
	Restore RestoreRun `json:"restore"`
	// Skipped says why nothing was backed up.
	Skipped string   `json:"skipped,omitempty"`
	Notes   []string `json:"notes,omitempty"`
}

// BackupRun is one VirtualMachineBackup, its figures as the node reported
// them in its status.
type BackupRun struct {
	Name   string `json:"name"`
	UID    string `json:"uid"`
	Phase  string `json:"phase"`
	Full   bool   `json:"full"`
	Frozen bool   `json:"frozen"`
	Parent string `json:"parent,omitempty"`
	// DurationSeconds is the node's (status.durationMilliseconds).
	DurationSeconds float64 `json:"durationSeconds"`
	// CreateToDoneSeconds is from the Create call to the first poll (every
	// guestPoll) showing it done: the hub's and the node's way to it too.
	CreateToDoneSeconds float64 `json:"createToDoneSeconds"`
	BytesRead           int64   `json:"bytesRead"`
	BytesWritten        int64   `json:"bytesWritten"`
	ChunksWritten       int64   `json:"chunksWritten"`
	ChunksReused        int64   `json:"chunksReused"`
	// ReadBytesPerSecond is BytesRead over DurationSeconds.
	ReadBytesPerSecond float64 `json:"readBytesPerSecond"`
}

// RawUpload is one object of random bytes put to the backup location's
// bucket with minio-go's PutObject from the benchmark's process, timed.
type RawUpload struct {
	Object         string  `json:"object"`
	Bytes          int64   `json:"bytes"`
	Seconds        float64 `json:"seconds"`
	BytesPerSecond float64 `json:"bytesPerSecond"`
}

// RestoreRun is a VM made again from a backup: a DiskImage of its root
// disk (format raw), a Volume of it and the VM, created together, timed as
// GuestBoot's boot is.
type RestoreRun struct {
	BootTimes
	// SHA256 is the sha256 of guestFile the guest printed before the
	// incremental backup; Intact whether the restored guest's is the same.
	SHA256 string `json:"sha256"`
	Intact bool   `json:"intact"`
}

// targetBackupOfRaw is issue 54's limit: a backup's read throughput at
// least this share of a raw upload's to the same store, in the same run.
const targetBackupOfRaw = 0.70

const (
	// guestFile is what the guest writes between the backups: guestWrite
	// MiB of random data, so no chunk of it is in the store yet.
	guestFile  = "/var/tmp/bench"
	guestWrite = 100
	// guestWritePoll is how often the benchmark logs in to see whether
	// the write is done: each login costs an emulated guest a second of
	// CPU or more.
	guestWritePoll = 2 * time.Second
	// backupTimeout bounds one backup: a full one on a busy 2-core
	// machine takes minutes.
	backupTimeout = 20 * time.Minute
	// rawObject is the raw upload's object, beside the backups' objects.
	rawObject = "bench-raw/full-backup-size"
	// The first guest's VM, and the names of what its restore makes.
	guestVMName    = "guest"
	restoredVMName = "restored"
)

// runBackups backs runGuest's guest up whole, uploads as many raw bytes
// to the same store, writes guestWrite MiB in the guest and backs it up
// again, then stops it and makes a VM from the second backup. What fails
// along the way is noted in b; an error is the benchmark's own failure.
func runBackups(ctx context.Context, s *stack.Stack, hostOf func(string) *guesthost.Host, key string, b *GuestBackup, w io.Writer) error {
	progress := func(format string, args ...any) {
		fmt.Fprintf(w, "%s %-12s %s\n", time.Now().Format("15:04:05"), "backup", fmt.Sprintf(format, args...))
	}
	note := func(format string, args ...any) {
		b.Notes = append(b.Notes, fmt.Sprintf(format, args...))
		progress("%s", b.Notes[len(b.Notes)-1])
	}
	kube := s.ControlPlane.Client
	vm := &v1alpha1.VirtualMachine{}
	if err := kube.Get(ctx, client.ObjectKey{Namespace: guestNamespace, Name: guestVMName}, vm); err != nil {
		return errors.Wrap(err, "cannot get the guest's VM")
	}
	ip, netns := address(vm), hostOf(vm.Status.AtProvider.Node).Netns
	// A guest still running cloud-init would compete with its backup.
	if _, _, err := settleGuest(ctx, kube, hostOf, key, progress); err != nil {
		note("%v", err)
		return nil
	}

	progress("full backup of the running guest")
	fullUID, failed, err := backUp(ctx, kube, guestVMName+"-full", true, &b.Full)
	if err != nil {
		return err
	}
	if failed != "" {
		note("%s", failed)
		return nil
	}
	progress("full backup: %.0f MiB read, %.0f MiB written in %.1f s (%.1f MiB/s read)",
		mib(b.Full.BytesRead), mib(b.Full.BytesWritten), b.Full.DurationSeconds, mib(int64(b.Full.ReadBytesPerSecond)))
	if !b.Full.Full {
		note("the first backup did not read the disk whole")
	}
	if !b.Full.Frozen {
		note("the guest agent did not freeze the guest's filesystems for the full backup")
	}
	full := &v1alpha1.VirtualMachineBackup{}
	if err := kube.Get(ctx, client.ObjectKey{Namespace: guestNamespace, Name: b.Full.Name}, full); err == nil && full.Status.Size != nil {
		b.DiskBytes = full.Status.Size.Value()
	}

	progress("raw upload of %.0f MiB of random bytes to the same bucket", mib(b.Full.BytesRead))
	if err := rawUpload(ctx, s.ObjectStore, b.Full.BytesRead, &b.Raw); err != nil {
		note("the raw upload failed: %v", err)
	} else {
		b.FullOfRaw = ratio(b.Full.ReadBytesPerSecond, b.Raw.BytesPerSecond)
		progress("raw upload: %.1f s, %.1f MiB/s; the full backup read at %.0f%% of it", b.Raw.Seconds, mib(int64(b.Raw.BytesPerSecond)), 100*b.FullOfRaw)
	}

	progress("writing %d MiB of random data in the guest", guestWrite)
	sum, failed := writeInGuest(ctx, netns, key, ip, b)
	if failed != "" {
		note("%s", failed)
		return nil
	}
	b.Restore.SHA256 = sum
	progress("written and synced after %.1f s; sha256 %s", b.GuestWriteSeconds, sum)

	progress("incremental backup")
	incrUID, failed, err := backUp(ctx, kube, guestVMName+"-incr", false, &b.Incremental)
	if err != nil {
		return err
	}
	if failed != "" {
		note("%s", failed)
		return nil
	}
	b.IncrementalReadOfWritten = ratio(float64(b.Incremental.BytesRead), float64(b.GuestWrittenBytes))
	b.IncrementalOfRaw = ratio(b.Incremental.ReadBytesPerSecond, b.Raw.BytesPerSecond)
	progress("incremental backup: %.0f MiB read (%.2f× what the guest wrote), %.0f MiB written, %d chunks reused, in %.1f s (%.1f MiB/s read, %.0f%% of the raw upload's)",
		mib(b.Incremental.BytesRead), b.IncrementalReadOfWritten, mib(b.Incremental.BytesWritten), b.Incremental.ChunksReused,
		b.Incremental.DurationSeconds, mib(int64(b.Incremental.ReadBytesPerSecond)), 100*b.IncrementalOfRaw)
	if b.Incremental.Full {
		note("the second backup read the disk whole, not only what changed")
	}
	if b.Incremental.Parent != fullUID {
		note("the second backup's parent is %q, not the full backup %s", b.Incremental.Parent, fullUID)
	}

	progress("stopping the guest")
	if failed := stopGuest(ctx, kube, vm, b); failed != "" {
		note("%s", failed)
		return nil
	}
	progress("stopped after %.1f s; restoring the incremental backup", b.StopSeconds)
	failed, err = restore(ctx, kube, hostOf, key, vm.Spec.ForProvider.PublicKey, incrUID, &b.Restore, progress)
	if err != nil {
		return err
	}
	if failed != "" {
		note("%s", failed)
	}
	return nil
}

// backUp takes backup name of the guest's VM, full or not, waits for it
// to end and fills r. It returns the backup's uid, or what failed.
func backUp(ctx context.Context, kube client.Client, name string, full bool, r *BackupRun) (uid, failed string, err error) {
	b := &v1alpha1.VirtualMachineBackup{
		ObjectMeta: metav1.ObjectMeta{Namespace: guestNamespace, Name: name},
		Spec:       v1alpha1.VirtualMachineBackupSpec{VMName: guestVMName, Location: stack.LocationName, Full: full},
	}
	if err := kube.Create(ctx, b); err != nil {
		return "", "", errors.Wrapf(err, "cannot create backup %s", name)
	}
	created := time.Now()
	r.Name, r.UID = name, string(b.UID)
	if werr := wait.PollUntilContextTimeout(ctx, guestPoll, backupTimeout, true, func(ctx context.Context) (bool, error) {
		if err := kube.Get(ctx, client.ObjectKeyFromObject(b), b); err != nil {
			return false, err
		}
		return b.Done(), nil
	}); werr != nil {
		r.Phase = string(b.Status.Phase)
		return r.UID, fmt.Sprintf("backup %s not done within %s (%v): %s %s", name, backupTimeout, werr, b.Status.Phase, b.Status.Message), nil
	}
	r.CreateToDoneSeconds = time.Since(created).Seconds()
	st := b.Status
	r.Phase, r.Full, r.Frozen, r.Parent = string(st.Phase), st.Full, st.Frozen, st.Parent
	r.DurationSeconds = float64(st.DurationMilliseconds) / 1000
	r.BytesRead, r.BytesWritten, r.ChunksWritten, r.ChunksReused = st.BytesRead, st.BytesWritten, st.ChunksWritten, st.ChunksReused
	r.ReadBytesPerSecond = ratio(float64(st.BytesRead), r.DurationSeconds)
	if st.Phase != v1alpha1.BackupSucceeded {
		return r.UID, fmt.Sprintf("backup %s %s: %s", name, st.Phase, st.Message), nil
	}
	return r.UID, "", nil
}

// rawUpload puts n random bytes to the location's bucket as one object
// with minio-go's PutObject, as an ordinary client would (its defaults: a
// multipart upload of 16 MiB parts, one after another, each signed), and
// times it. The bytes come from a ChaCha8 stream, far faster than the
// store, and never repeat, so the store cannot shortcut them. The object
// is removed afterwards, leaving the location to the backups.
func rawUpload(ctx context.Context, srv *s3test.Server, n int64, r *RawUpload) error {
	if n <= 0 {
		return errors.New("the full backup read nothing to compare with")
	}
	c, err := srv.Client()
	if err != nil {
		return err
	}
	var seed [32]byte
	if _, err := crand.Read(seed[:]); err != nil {
		return errors.Wrap(err, "cannot seed the random bytes")
	}
	r.Object, r.Bytes = stack.LocationBucket+"/"+rawObject, n
	start := time.Now()
	info, err := c.PutObject(ctx, stack.LocationBucket, rawObject, io.LimitReader(rand.NewChaCha8(seed), n), n, minio.PutObjectOptions{ContentType: "application/octet-stream"})
	if err != nil {
		return errors.Wrap(err, "cannot upload")
	}
	r.Seconds = time.Since(start).Seconds()
	if info.Size != n {
		return errors.Errorf("uploaded %d bytes of %d", info.Size, n)
	}
	r.BytesPerSecond = float64(n) / r.Seconds
	return errors.Wrap(c.RemoveObject(ctx, stack.LocationBucket, rawObject, minio.RemoveObjectOptions{}), "cannot remove the raw upload")
}

// writeInGuest has the guest at ip write guestWrite MiB of random data to
// guestFile and sync, and returns the file's sha256 as the guest computes
// it. The write runs detached from the ssh session, which is cut after
// 30 s: an emulated guest may take longer than that.
func writeInGuest(ctx context.Context, netns, key, ip string, b *GuestBackup) (sum, failed string) {
	script := fmt.Sprintf("dd if=/dev/urandom of=%[1]s bs=1M count=%[2]d status=none && sync && sha256sum %[1]s > %[1]s.sha256.part && mv %[1]s.sha256.part %[1]s.sha256", guestFile, guestWrite)
	start := time.Now()
	if out, err := guesthost.SSHUntil(ctx, netns, key, guestimage.DefaultUser, ip,
		fmt.Sprintf("sudo rm -f %s.sha256; sudo setsid sh -c '%s' </dev/null >/dev/null 2>&1 &", guestFile, script), guestWritePoll, guestTimeout); err != nil {
		return "", fmt.Sprintf("cannot start the write in the guest: %v: %s", err, out)
	}
	out, err := guesthost.SSHUntil(ctx, netns, key, guestimage.DefaultUser, ip, "cat "+guestFile+".sha256", guestWritePoll, guestTimeout)
	if err != nil {
		return "", fmt.Sprintf("the guest did not write %d MiB within %s: %v: %s", guestWrite, guestTimeout, err, out)
	}
	b.GuestWriteSeconds, b.GuestWrittenBytes = time.Since(start).Seconds(), guestWrite<<20
	if sum = sha256Of(out, guestFile); sum == "" {
		return "", fmt.Sprintf("the guest printed no sha256 of %s: %s", guestFile, out)
	}
	return sum, ""
}

// sha256Of is the digest sha256sum printed for file in out, or "": out
// holds stderr too, where sudo warns of what it cannot resolve (a guest
// made again under another name does not know its new hostname).
func sha256Of(out, file string) string {
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[1] == file && len(f[0]) == sha256.Size*2 {
			return f[0]
		}
	}
	return ""
}

// stopGuest stops vm and waits for it to be Stopped.
func stopGuest(ctx context.Context, kube client.Client, vm *v1alpha1.VirtualMachine, b *GuestBackup) string {
	patch := client.MergeFrom(vm.DeepCopy())
	vm.Spec.ForProvider.Running = ptr.To(false)
	if err := kube.Patch(ctx, vm, patch); err != nil {
		return fmt.Sprintf("cannot stop the guest: %v", err)
	}
	asked := time.Now()
	if err := poll(ctx, func() (bool, error) {
		if err := kube.Get(ctx, client.ObjectKeyFromObject(vm), vm); err != nil {
			return false, err
		}
		return vm.Status.AtProvider.Phase == v1alpha1.PhaseStopped, nil
	}); err != nil {
		return fmt.Sprintf("the guest did not stop within %s (%v): phase %s", guestTimeout, err, vm.Status.AtProvider.Phase)
	}
	b.StopSeconds = time.Since(asked).Seconds()
	return ""
}

// restore makes a VM of the root disk of backup id, as a user would
// (DiskImage, Volume and VM created together), times its boot, and checks
// over ssh that guestFile is as it was backed up.
func restore(ctx context.Context, kube client.Client, hostOf func(string) *guesthost.Host, key, pub, id string, r *RestoreRun, progress func(string, ...any)) (failed string, err error) {
	raw := v1alpha1.DiskFormatRaw
	di := &v1alpha1.DiskImage{
		ObjectMeta: metav1.ObjectMeta{Namespace: guestNamespace, Name: "from-backup"},
		Spec: v1alpha1.DiskImageSpec{ForProvider: v1alpha1.DiskImageParameters{
			Format: &raw,
			Source: v1alpha1.DiskImageSource{Backup: &v1alpha1.DiskImageBackupSource{Location: stack.LocationName, ID: id}},
		}},
	}
	vol := &v1alpha1.Volume{
		ObjectMeta: metav1.ObjectMeta{Namespace: guestNamespace, Name: restoredVMName + "-root"},
		Spec: v1alpha1.VolumeSpec{ForProvider: v1alpha1.VolumeParameters{
			Size:   resource.MustParse("4Gi"),
			Source: &v1alpha1.VolumeSource{DiskImageRef: &v1alpha1.LocalReference{Name: v1alpha1.LocalName(di.Name)}},
		}},
	}
	vm := guestVM(restoredVMName, vol.Name, pub)
	for _, obj := range []client.Object{di, vol, vm} {
		if err := kube.Create(ctx, obj); err != nil {
			return "", errors.Wrapf(err, "cannot create %T %s", obj, obj.GetName())
		}
	}
	ip, failed := timeBoot(ctx, kube, hostOf, key, di, vm, time.Now(), &r.BootTimes, progress)
	if failed != "" {
		return "restore: " + failed, nil
	}
	out, err := guesthost.SSHUntil(ctx, hostOf(vm.Status.AtProvider.Node).Netns, key, guestimage.DefaultUser, ip, "sudo sha256sum "+guestFile, guestWritePoll, guestTimeout)
	if err != nil {
		return fmt.Sprintf("restore: cannot read %s in the restored guest: %v: %s", guestFile, err, out), nil
	}
	got := sha256Of(out, guestFile)
	if got == "" {
		return fmt.Sprintf("restore: the restored guest printed no sha256 of %s: %s", guestFile, out), nil
	}
	r.Intact = got == r.SHA256
	if !r.Intact {
		return fmt.Sprintf("restore: %s's sha256 is %s in the restored guest, %s in the guest backed up", guestFile, got, r.SHA256), nil
	}
	progress("the restored guest's %s is as backed up (sha256 %s)", guestFile, got)
	return "", nil
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// backupTargets judge each backup's read throughput against the raw
// upload's, issue 54's limit.
func backupTargets(b *GuestBackup) []Target {
	if b == nil || b.Skipped != "" || b.Raw.BytesPerSecond == 0 {
		return nil
	}
	var out []Target
	for _, run := range []struct {
		name  string
		r     BackupRun
		ratio float64
	}{{"full", b.Full, b.FullOfRaw}, {"incremental", b.Incremental, b.IncrementalOfRaw}} {
		if run.r.Phase == "" {
			continue
		}
		out = append(out, Target{
			Name: fmt.Sprintf("%s backup of the real guest: read throughput vs a raw upload to the same store", run.name),
			Goal: fmt.Sprintf("≥ %.0f%%", 100*targetBackupOfRaw),
			Measured: fmt.Sprintf("%.0f%% (%.1f of %.1f MiB/s)", 100*run.ratio,
				run.r.ReadBytesPerSecond/(1<<20), b.Raw.BytesPerSecond/(1<<20)),
			Met: run.r.Phase == string(v1alpha1.BackupSucceeded) && run.ratio >= targetBackupOfRaw,
		})
	}
	return out
}

// backupMarkdown renders the backups' section.
func backupMarkdown(p func(string, ...any), b *GuestBackup) {
	if b == nil {
		return
	}
	p("## Backups of the real guest, and a restore")
	p("")
	if b.Skipped != "" {
		p("Skipped: %s.", b.Skipped)
		p("")
		return
	}
	p("The guest above, once cloud-init is done, backed up while it runs to the BackupLocation `%s`: a bucket of a SeaweedFS server (`weed server -s3`) started with the stack on this machine, over plain HTTP on 127.0.0.1. The agent reads the disk through libvirt's push-mode backup and uploads it as content-addressed chunks of 1 MiB, 8 at a time. Right after the full backup, the benchmark uploads as many random bytes to the same bucket as one object with minio-go's PutObject (its defaults: a multipart upload of 16 MiB parts, one after another): the store's raw throughput in the same run, on the same loaded machine. Then the guest writes %d MiB of random data to `%s` and syncs, and is backed up again; the second backup reads only what changed. Durations and bytes are the node's own (the backup's status); throughput is bytes read over that duration.",
		b.Location, guestWrite, guestFile)
	p("")
	ofRaw := func(r float64) string {
		if r == 0 {
			return "–"
		}
		met := "not met"
		if r >= targetBackupOfRaw {
			met = "met"
		}
		return fmt.Sprintf("%s (%s)", pct(r), met)
	}
	perS := func(bps float64) string {
		if bps == 0 {
			return "–"
		}
		return fmt.Sprintf("%.1f MiB/s", bps/(1<<20))
	}
	chunks := func(r BackupRun) string { return fmt.Sprintf("%d / %d", r.ChunksWritten, r.ChunksReused) }
	f, i := b.Full, b.Incremental
	p("| measure | full backup | incremental backup | raw upload | target |")
	p("| --- | --- | --- | --- | --- |")
	p("| phase | %s | %s | | |", orDash(f.Phase), orDash(i.Phase))
	p("| filesystems frozen by the guest agent | %s | %s | | |", yesNo(f.Frozen), yesNo(i.Frozen))
	p("| bytes read of the disk | %.1f MiB of %.1f GiB | %.1f MiB (%.2f× the %d MiB written) | | |", mib(f.BytesRead), float64(b.DiskBytes)/(1<<30), mib(i.BytesRead), b.IncrementalReadOfWritten, guestWrite)
	p("| bytes written to the store | %.1f MiB | %.1f MiB | %.1f MiB | |", mib(f.BytesWritten), mib(i.BytesWritten), mib(b.Raw.Bytes))
	p("| chunks written / reused | %s | %s | | |", chunks(f), chunks(i))
	p("| duration | %s | %s | %s | |", seconds(f.DurationSeconds), seconds(i.DurationSeconds), seconds(b.Raw.Seconds))
	p("| create→done, seen by the benchmark | %s | %s | | |", seconds(f.CreateToDoneSeconds), seconds(i.CreateToDoneSeconds))
	p("| throughput (bytes read / duration) | %s | %s | %s | |", perS(f.ReadBytesPerSecond), perS(i.ReadBytesPerSecond), perS(b.Raw.BytesPerSecond))
	p("| of the raw upload's throughput | %s | %s | | ≥ %.0f%% |", ofRaw(b.FullOfRaw), ofRaw(b.IncrementalOfRaw), 100*targetBackupOfRaw)
	p("")
	p("The restore: the guest stopped (spec.running false; Stopped after %s) to give the machine its CPU back, then a DiskImage of the incremental backup's root disk (format raw), a 4 GiB Volume of it and a VM, created together as a user would, on the same node. Times are from the VM's Create call, read by polling every %s, as the guest's boot above.", seconds(b.StopSeconds), guestPoll)
	p("")
	t := b.Restore.BootTimes
	p("| measure | value |")
	p("| --- | --- |")
	p("| create→image on the node (made from the backup) | %s |", seconds(t.ImportSeconds))
	p("| create→Running | %s |", seconds(t.CreateToRunningSeconds))
	p("| create→address | %s |", seconds(t.CreateToAddressSeconds))
	p("| create→ssh | %s |", seconds(t.CreateToSSHSeconds))
	p("| `%s` as backed up (sha256) | %s |", guestFile, yesNo(b.Restore.Intact))
	notes(p, b.Notes)
	p("")
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func orDash(s string) string {
	if s == "" {
		return "–"
	}
	return s
}
