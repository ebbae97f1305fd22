package guest

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"
	"github.com/minio/minio-go/v7"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/harness/stack"
)

// What the backup steps write in the guest: a marker before the first
// backup, and newData MiB of random data between the two.
const (
	backupMarker = "/var/tmp/vf-backup-marker"
	backupData   = "/var/tmp/vf-backup-data"
	newData      = 100
)

// backupSlack is what an incremental backup may read and write beyond the
// data the guest wrote: the filesystem's own metadata and journal, and the
// disk's other writers (logs) in the meantime, at the granularity of a
// chunk.
const backupSlack = 1.2

// backedUp is what the second backup of backUpTwice holds, and what the
// first, full one added to the store.
type backedUp struct {
	id   string // the backup's uid, which a DiskImage names
	sums string // sha256sum of the files written, as the guest printed it
	// fullWritten is what the full backup wrote, as its status says;
	// fullStored what the store grew by with it.
	fullWritten, fullStored int64
}

// backUpTwice backs VM name, running at ip, up whole to the stack's
// location, writes newData MiB in it, and backs it up again: the second
// backup reads and writes about what the guest wrote, counted both in its
// status and at the store, and the guest ran throughout (the same boot).
func (g *suite) backUpTwice(t *testing.T, name, ip string) backedUp {
	bootID := g.facts(t, ip).bootID
	g.sshUntil(t, ip, "echo 'kept by the full backup' | sudo tee "+backupMarker+" >/dev/null && sync", time.Minute)

	before := g.storedBytes(t)
	full := g.backUp(t, name+"-full", name)
	fullStored := g.storedBytes(t) - before
	assert.True(t, full.Status.Full, "the VM's first backup reads its disks whole")
	assert.True(t, full.Status.Frozen, "the guest agent froze the filesystems for it")
	t.Logf("full backup of %s: %d bytes read, %d written (store +%d) in %d ms", full.Status.Size, full.Status.BytesRead, full.Status.BytesWritten, fullStored, full.Status.DurationMilliseconds)

	// notrunc: a command sshUntil runs again (an ssh that took too long on
	// a busy machine) writes the same blocks of the file again, not new
	// ones the next backup would read as well.
	g.sshUntil(t, ip, "sudo dd if=/dev/urandom of="+backupData+" bs=1M count="+strconv.Itoa(newData)+" conv=notrunc status=none && sync", 5*time.Minute)
	sums := g.sshUntil(t, ip, "sha256sum "+backupMarker+" "+backupData, time.Minute)
	before = g.storedBytes(t)
	incr := g.backUp(t, name+"-incr", name)
	stored := g.storedBytes(t) - before
	assert.False(t, incr.Status.Full, "the second reads only what changed")
	assert.Equal(t, string(full.UID), incr.Status.Parent)
	limit := int64(backupSlack*newData) << 20
	assert.LessOrEqual(t, incr.Status.BytesRead, limit, "read at most %.1f× what the guest wrote", backupSlack)
	assert.LessOrEqual(t, stored, limit+1<<20, "the store grew by at most %.1f× what the guest wrote and the manifest", backupSlack)
	assert.GreaterOrEqual(t, incr.Status.BytesWritten, int64(newData)<<20, "random data is new to the store")
	t.Logf("incremental backup after %d MiB written: %d bytes read, %d written (store +%d) in %d ms, %d chunks reused",
		newData, incr.Status.BytesRead, incr.Status.BytesWritten, stored, incr.Status.DurationMilliseconds, incr.Status.ChunksReused)
	assert.Equal(t, bootID, g.facts(t, ip).bootID, "the guest ran on through both backups")
	return backedUp{id: string(incr.UID), sums: sums, fullWritten: full.Status.BytesWritten, fullStored: fullStored}
}

// alikeShare is at most what the first backup of a VM made from the same
// image as one backed up before adds to the location, as a share of what
// that one's full backup added: the image's data is there already.
const alikeShare = 0.10

// backUpAlike backs VM name up for the first time, to the location VM
// first's full backup went to, both made from the same image: the backup
// reads the disks whole, yet adds at most alikeShare of what first's full
// backup added, as its status says and as counted at the store.
func (g *suite) backUpAlike(t *testing.T, name string, first backedUp) *v1alpha1.VirtualMachineBackup {
	before := g.storedBytes(t)
	b := g.backUp(t, name+"-full", name)
	stored := g.storedBytes(t) - before
	t.Logf("first backup of %s, from the same image: %d bytes read, %d written (%.1f%% of the first VM's %d), store +%d (%.1f%% of the first VM's +%d), %d chunks written, %d reused, in %d ms",
		name, b.Status.BytesRead, b.Status.BytesWritten, percent(b.Status.BytesWritten, first.fullWritten), first.fullWritten,
		stored, percent(stored, first.fullStored), first.fullStored, b.Status.ChunksWritten, b.Status.ChunksReused, b.Status.DurationMilliseconds)
	assert.True(t, b.Status.Full, "the VM's first backup reads its disks whole")
	assert.LessOrEqual(t, float64(b.Status.BytesWritten), alikeShare*float64(first.fullWritten), "written: at most %.0f%% of the first VM's full backup", 100*alikeShare)
	assert.LessOrEqual(t, float64(stored), alikeShare*float64(first.fullStored), "the store grew by at most %.0f%% of what the first VM's full backup added", 100*alikeShare)
	return b
}

// percent is part as a percentage of whole.
func percent(part, whole int64) float64 {
	if whole == 0 {
		return 0
	}
	return 100 * float64(part) / float64(whole)
}

// backUp takes backup name of VM vm and waits for it to succeed.
func (g *suite) backUp(t *testing.T, name, vm string) *v1alpha1.VirtualMachineBackup {
	t.Helper()
	g.create(&v1alpha1.VirtualMachineBackup{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       v1alpha1.VirtualMachineBackupSpec{VMName: v1alpha1.LocalName(vm), Location: stack.LocationName},
	})
	b := &v1alpha1.VirtualMachineBackup{}
	require.Eventually(t, func() bool {
		err := g.kube.Get(g.ctx, types.NamespacedName{Namespace: ns, Name: name}, b)
		return err == nil && b.Done()
	}, 10*time.Minute, time.Second, "backup %s ends", name)
	require.Equal(t, v1alpha1.BackupSucceeded, b.Status.Phase, b.Status.Message)
	return b
}

// storedBytes is what the stack's location holds, counted at the store.
func (g *suite) storedBytes(t *testing.T) int64 {
	t.Helper()
	c, err := g.s.ObjectStore.Client()
	require.NoError(t, err)
	var n int64
	for o := range c.ListObjects(g.ctx, stack.LocationBucket, minio.ListObjectsOptions{Recursive: true}) {
		require.NoError(t, o.Err)
		n += o.Size
	}
	return n
}

// madeAgain makes a VM from the root disk of backup b on node, and checks
// over ssh that every file written before the backup is there as it was.
// The files are read without sudo: the VM made again has a name of its
// own, which sudo warns it cannot resolve, and the warning is no file's.
func (g *suite) madeAgain(t *testing.T, b backedUp, node string) {
	raw := v1alpha1.DiskFormatRaw
	g.create(&v1alpha1.DiskImage{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "from-backup"},
		Spec: v1alpha1.DiskImageSpec{ForProvider: v1alpha1.DiskImageParameters{
			Format: &raw,
			Source: v1alpha1.DiskImageSource{Backup: &v1alpha1.DiskImageBackupSource{Location: stack.LocationName, ID: b.id}},
		}},
	})
	g.create(&v1alpha1.Volume{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "again-root"},
		Spec: v1alpha1.VolumeSpec{ForProvider: v1alpha1.VolumeParameters{
			Size:   resource.MustParse("4Gi"),
			Source: &v1alpha1.VolumeSource{DiskImageRef: &v1alpha1.LocalReference{Name: "from-backup"}},
		}},
	})
	v := vm("again", g.pub, 1)
	v.Spec.ForProvider.Memory = resource.MustParse("512Mi")
	v.Spec.ForProvider.Swap = nil
	v.Spec.ForProvider.Running = ptr.To(true)
	meta.AddAnnotations(v, map[string]string{v1alpha1.AnnotationNode: node})
	created := time.Now()
	g.create(v)
	_, ip := g.on(node).waitRunningWithAddress(t, "again", created)
	t.Logf("VM made from backup %s running with ssh on %s %s after the request", b.id, node, time.Since(created).Round(time.Second))
	got := g.on(node).sshUntil(t, ip, "sha256sum "+backupMarker+" "+backupData, time.Minute)
	assert.Equal(t, strings.TrimSpace(b.sums), strings.TrimSpace(got), "every file as it was at the backup")
}

// backedUpAfterTheMove backs VM name, running at ip, up on node, where a
// live migration copied its disk: libvirt's copy would keep no dirty
// bitmap (qcow2 version 2), the driver's does. The backup is full, its
// checkpoints having stayed on the node it came from, and the guest runs
// on.
func (g *suite) backedUpAfterTheMove(t *testing.T, name, ip, node string) {
	bootID := g.facts(t, ip).bootID
	b := g.backUp(t, name+"-moved", name)
	t.Logf("backup of %s on %s after its move: full %t, %d bytes read, %d written, %d chunks reused, in %d ms",
		name, node, b.Status.Full, b.Status.BytesRead, b.Status.BytesWritten, b.Status.ChunksReused, b.Status.DurationMilliseconds)
	assert.Equal(t, node, b.Status.Node)
	assert.True(t, b.Status.Full, "its checkpoints stayed on the node it left")
	assert.Equal(t, bootID, g.facts(t, ip).bootID, "the guest ran on through the backup")
}
