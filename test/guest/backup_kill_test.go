package guest

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"
	golibvirt "github.com/digitalocean/go-libvirt"
	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/harness/stack"
)

// afterKill are the files written in the guest after its agent was killed
// mid-backup, one before each of the two backups that follow, and how
// many MiB of random data each holds.
var afterKill = []string{"/var/tmp/vf-after-kill-1", "/var/tmp/vf-after-kill-2"}

const afterKillMiB = 8

// backupTimeout bounds one backup of a guest, from its creation to its
// end, on a busy machine.
const backupTimeout = 10 * time.Minute

// heldAt is a backup and the files the guest held when it was taken, as
// sha256sum printed them there.
type heldAt struct {
	backup *v1alpha1.VirtualMachineBackup
	files  []string
	sums   string
}

// killedMidBackup starts a backup of VM name, running at ip on node, that
// reads its disks whole, and kills the node's agent with SIGKILL once the
// backup's status shows it reading; the agent is started again. The backup
// ends Failed with a reason, never Succeeded, and the guest runs on (the
// same boot). Then a file is written and the VM backed up, and another and
// backed up again: the first is full or since last, the VM's last backup
// that succeeded, never since the killed one; the second only what changed
// since the first. It returns those two backups and the files each holds.
func (g *suite) killedMidBackup(t *testing.T, name, ip, node string, last *v1alpha1.VirtualMachineBackup) []heldAt {
	bootID := g.facts(t, ip).bootID
	killed := name + "-killed"
	// Full: it reads the whole disk, so it is long enough to be caught
	// reading, whatever the VM wrote since its last backup.
	g.create(&v1alpha1.VirtualMachineBackup{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: killed},
		Spec:       v1alpha1.VirtualMachineBackupSpec{VMName: v1alpha1.LocalName(name), Location: stack.LocationName, Full: true},
	})
	var phases []v1alpha1.BackupPhase
	b := &v1alpha1.VirtualMachineBackup{}
	watch := func(done func() bool) error {
		return wait.PollUntilContextTimeout(g.ctx, 100*time.Millisecond, backupTimeout, true, func(ctx context.Context) (bool, error) {
			if err := g.kube.Get(ctx, types.NamespacedName{Namespace: ns, Name: killed}, b); err != nil {
				return false, nil
			}
			if p := b.Status.Phase; len(phases) == 0 || phases[len(phases)-1] != p {
				phases = append(phases, p)
			}
			return done(), nil
		})
	}
	var ended error
	err := watch(func() bool {
		if b.Done() {
			ended = fmt.Errorf("backup %s ended %s before it was seen reading: %s", killed, b.Status.Phase, b.Status.Message)
			return true
		}
		return b.Status.Phase == v1alpha1.BackupInProgress && b.Status.BytesRead > 0
	})
	require.NoError(t, errors.Join(err, ended), "backup %s shows it reading; phases seen %v, last status %+v", killed, phases, b.Status)
	t.Logf("killing the agent of %s while backup %s has read %d bytes and written %d", node, killed, b.Status.BytesRead, b.Status.BytesWritten)
	g.s.KillAgent(node)
	require.NoError(t, g.s.StartAgent(node))
	restarted := time.Now()
	require.NoError(t, watch(b.Done), "backup %s ends; phases seen %v, last status %+v", killed, phases, b.Status)
	t.Logf("backup %s %s %s after the agent's restart: %s", killed, b.Status.Phase, time.Since(restarted).Round(time.Second), b.Status.Message)
	assert.NotContains(t, phases, v1alpha1.BackupSucceeded, "never shown complete; phases seen %v", phases)
	require.Equal(t, v1alpha1.BackupFailed, b.Status.Phase, b.Status.Message)
	assert.NotEmpty(t, b.Status.Message, "the reason")
	assert.Equal(t, bootID, g.facts(t, ip).bootID, "the guest ran on through the kill")
	g.on(node).backupJobEnds(t, g.get(t, name).UID)

	held := make([]heldAt, 0, len(afterKill))
	for i, file := range afterKill {
		g.sshUntil(t, ip, fmt.Sprintf("sudo dd if=/dev/urandom of=%s bs=1M count=%d conv=notrunc status=none && sync", file, afterKillMiB), 3*time.Minute)
		files := afterKill[:i+1]
		h := heldAt{files: files, sums: g.sshUntil(t, ip, "sha256sum "+strings.Join(files, " "), 3*time.Minute)}
		h.backup = g.backUp(t, fmt.Sprintf("%s-after-kill-%d", name, i+1), name)
		st := h.backup.Status
		t.Logf("backup %d after the kill: full %t, parent %q, %d bytes read, %d written, %d chunks reused, in %d ms",
			i+1, st.Full, st.Parent, st.BytesRead, st.BytesWritten, st.ChunksReused, st.DurationMilliseconds)
		assert.NotEqual(t, string(b.UID), st.Parent, "never since the backup that failed")
		if i == 0 {
			assert.True(t, st.Full || st.Parent == string(last.UID), "full, or since %s, the last that succeeded; parent %q", last.Name, st.Parent)
		} else {
			assert.False(t, st.Full, "only what changed since the backup before")
			assert.Equal(t, string(held[i-1].backup.UID), st.Parent)
		}
		held = append(held, h)
	}
	require.NoError(t, g.kube.Get(g.ctx, types.NamespacedName{Namespace: ns, Name: killed}, b))
	assert.Equal(t, v1alpha1.BackupFailed, b.Status.Phase, "the killed backup stays Failed")
	assert.Equal(t, bootID, g.facts(t, ip).bootID, "the guest ran on through every backup")
	return held
}

// backupJobEnds waits until the guest of the VM with uid runs no backup
// job: the one a killed agent began runs on in libvirt, and a backup
// begun meanwhile would be refused.
func (g *suite) backupJobEnds(t *testing.T, uid types.UID) {
	t.Helper()
	l, err := g.host.Dial()
	require.NoError(t, err)
	defer func() { _ = l.Disconnect() }()
	dom, err := l.DomainLookupByUUID(golibvirt.UUID(uuid.MustParse(string(uid))))
	require.NoError(t, err)
	var last error
	err = wait.PollUntilContextTimeout(g.ctx, time.Second, backupTimeout, true, func(context.Context) (bool, error) {
		_, last = l.DomainBackupGetXMLDesc(dom, 0)
		var le golibvirt.Error
		return errors.As(last, &le) && le.Code == uint32(golibvirt.ErrNoDomainBackup), nil
	})
	require.NoError(t, err, "the backup job the killed agent began ends; last answer: %v", last)
}

// restoredAsHeld makes a DiskImage from the root disk of each backup and
// lands each on node as a raw volume, through one VM that uses them and is
// never started (no boot). Each image, attached read-only on this machine
// and its root filesystem mounted read-only, holds the files its backup
// held, with the sha256 the guest printed then, and none written after.
// What the step made is deleted again, so later steps find the node as
// before.
func (g *suite) restoredAsHeld(t *testing.T, node string, held []heldAt) {
	raw := v1alpha1.DiskFormatRaw
	v := vm("proof", g.pub, 1)
	v.Spec.ForProvider.Memory = resource.MustParse("256Mi")
	v.Spec.ForProvider.Swap = nil
	v.Spec.ForProvider.Running = ptr.To(false)
	v.Spec.ForProvider.DiskAttachments = nil
	meta.AddAnnotations(v, map[string]string{v1alpha1.AnnotationNode: node})
	images := make([]*v1alpha1.DiskImage, len(held))
	for i, h := range held {
		images[i] = &v1alpha1.DiskImage{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("proof-%d", i+1)},
			Spec: v1alpha1.DiskImageSpec{ForProvider: v1alpha1.DiskImageParameters{
				Format: &raw,
				Source: v1alpha1.DiskImageSource{Backup: &v1alpha1.DiskImageBackupSource{Location: stack.LocationName, ID: string(h.backup.UID)}},
			}},
		}
		vol := &v1alpha1.Volume{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("proof-%d-root", i+1)},
			Spec: v1alpha1.VolumeSpec{ForProvider: v1alpha1.VolumeParameters{
				Size:   resource.MustParse("4Gi"),
				Source: &v1alpha1.VolumeSource{DiskImageRef: &v1alpha1.LocalReference{Name: v1alpha1.LocalName(images[i].Name)}},
			}},
		}
		g.create(images[i])
		t.Cleanup(func() { g.deleteAndWait(t, images[i]) })
		g.create(vol)
		t.Cleanup(func() { g.deleteAndWait(t, vol) })
		v.Spec.ForProvider.DiskAttachments = append(v.Spec.ForProvider.DiskAttachments, v1alpha1.DiskAttachment{Name: v1alpha1.LocalName(vol.Name)})
	}
	created := time.Now()
	g.create(v)
	t.Cleanup(func() { g.deleteAndWait(t, v) })

	for i, h := range held {
		img := g.imageOn(t, images[i].Name, node)
		t.Logf("image of backup %s on %s %s after the request", h.backup.Name, node, time.Since(created).Round(time.Second))
		root := g.mountRootReadOnly(t, filepath.Join(g.hosts[node].LibDir("images"), g.on(node).volumeOf(t, img.UID)))
		assert.Equal(t, strings.TrimSpace(h.sums), sha256sums(t, root, h.files), "the files as they were at backup %s", h.backup.Name)
		for _, later := range afterKill[len(h.files):] {
			_, err := os.Stat(filepath.Join(root, later))
			assert.True(t, os.IsNotExist(err), "%s, written after backup %s, is not in it: %v", later, h.backup.Name, err)
		}
	}
}

// imageOn waits until DiskImage name is Ready on node, and returns it.
func (g *suite) imageOn(t *testing.T, name, node string) *v1alpha1.DiskImage {
	t.Helper()
	img := &v1alpha1.DiskImage{}
	err := wait.PollUntilContextTimeout(g.ctx, time.Second, backupTimeout, true, func(ctx context.Context) (bool, error) {
		if err := g.kube.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, img); err != nil {
			return false, nil
		}
		o := img.Status.AtProvider
		return o.Phase == v1alpha1.ImagePhaseReady && slices.Contains(o.Nodes, node), nil
	})
	require.NoError(t, err, "DiskImage %s Ready on %s; last status %+v", name, node, img.Status.AtProvider)
	return img
}

// volumeOf is the name of the volume of the host's pool that holds the
// image with uid: the only one its name carries the uid in.
func (g *suite) volumeOf(t *testing.T, uid types.UID) string {
	t.Helper()
	var found []string
	for _, name := range g.poolVolumes(t) {
		if strings.Contains(name, string(uid)) {
			found = append(found, name)
		}
	}
	require.Len(t, found, 1, "the volumes of image %s in the pool", uid)
	return found[0]
}

// deleteAndWait deletes o and waits until it is gone: a VM with its
// domain, a Volume with its disk on the node.
func (g *suite) deleteAndWait(t *testing.T, o client.Object) {
	ctx := context.WithoutCancel(g.ctx)
	if err := g.kube.Delete(ctx, o); err != nil && !kerrors.IsNotFound(err) {
		t.Errorf("cannot delete %T %s: %v", o, o.GetName(), err)
		return
	}
	err := wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		return kerrors.IsNotFound(g.kube.Get(ctx, client.ObjectKeyFromObject(o), o)), nil
	})
	if err != nil {
		t.Errorf("%T %s is not gone: %v", o, o.GetName(), err)
	}
}

// mountRootReadOnly attaches the largest partition of the raw disk image
// in file (the guest image's root; the partition table as sfdisk reads
// it) read-only as a loop device, and mounts its ext4 filesystem
// read-only, without replaying its journal; it returns the mount point.
// Both are undone when the test ends, whatever happened. The loop device
// is of the partition alone, by offset: a partition scan (losetup -P)
// makes no device nodes for the partitions where /dev is not the host's.
func (g *suite) mountRootReadOnly(t *testing.T, file string) string {
	t.Helper()
	out, err := exec.CommandContext(g.ctx, "sfdisk", "--json", file).Output()
	require.NoError(t, err, "sfdisk --json %s: %s", file, out)
	var table sfdiskTable
	require.NoError(t, json.Unmarshal(out, &table), "sfdisk --json %s: %s", file, out)
	require.NotEmpty(t, table.PartitionTable.Partitions, "the partitions of %s: %s", file, out)
	root := slices.MaxFunc(table.PartitionTable.Partitions, func(a, b sfdiskPartition) int { return cmp.Compare(a.Size, b.Size) })
	sector := cmp.Or(table.PartitionTable.SectorSize, 512)
	out, err = exec.CommandContext(g.ctx, "losetup", "--read-only", "--find", "--show",
		"--offset", strconv.FormatInt(root.Start*sector, 10), "--sizelimit", strconv.FormatInt(root.Size*sector, 10), file).CombinedOutput()
	require.NoError(t, err, "losetup %s: %s", file, out)
	dev := strings.TrimSpace(string(out))
	t.Cleanup(func() {
		if out, err := exec.Command("losetup", "--detach", dev).CombinedOutput(); err != nil {
			t.Errorf("losetup --detach %s: %v: %s", dev, err, out)
		}
	})
	typ, err := exec.CommandContext(g.ctx, "blkid", "--probe", "--output", "value", "--match-tag", "TYPE", dev).CombinedOutput()
	require.NoError(t, err, "blkid %s (partition %+v of %s): %s", dev, root, file, typ)
	require.Equal(t, "ext4", strings.TrimSpace(string(typ)), "the root filesystem of %s", file)
	dir := t.TempDir()
	out, err = exec.CommandContext(g.ctx, "mount", "-t", "ext4", "-o", "ro,noload", dev, dir).CombinedOutput()
	require.NoError(t, err, "mount %s: %s", dev, out)
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
	return dir
}

// sfdiskTable is what sfdisk --json prints of a disk's partition table.
type sfdiskTable struct {
	PartitionTable struct {
		SectorSize int64             `json:"sectorsize"`
		Partitions []sfdiskPartition `json:"partitions"`
	} `json:"partitiontable"`
}

// sfdiskPartition is one partition, in sectors.
type sfdiskPartition struct {
	Start int64 `json:"start"`
	Size  int64 `json:"size"`
}

// sha256sums is what sha256sum prints of files, read under root.
func sha256sums(t *testing.T, root string, files []string) string {
	t.Helper()
	lines := make([]string, 0, len(files))
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(root, f))
		if !assert.NoError(t, err, "%s in the restored disk", f) {
			continue
		}
		lines = append(lines, fmt.Sprintf("%x  %s", sha256.Sum256(b), f))
	}
	return strings.Join(lines, "\n")
}
