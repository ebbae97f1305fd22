package e2e

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	"github.com/minio/minio-go/v7"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	apisv1alpha1 "github.com/virtfleet/virtfleet/apis/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/backupstore"
	"github.com/virtfleet/virtfleet/internal/harness/stack"
)

// TestBackups backs VMs up to a real S3 store (SeaweedFS) and makes a VM
// again from a backup, through the Kubernetes API alone, on simulated
// nodes: the real hub, NATS, agents' reconcilers and store, over the
// in-memory driver (a real guest's disks: test/guest).
func TestBackups(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the whole stack; skipped with -short")
	}
	t.Parallel()
	h := startStack(t, "vf-backups-", stack.Options{Nodes: []string{"sim-1", "sim-2"}, Simulated: true, ObjectStore: true})
	ctx := context.Background()
	backupOf := func(name, vm string, edit ...func(*v1alpha1.VirtualMachineBackup)) *v1alpha1.VirtualMachineBackup {
		b := &v1alpha1.VirtualMachineBackup{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: v1alpha1.VirtualMachineBackupSpec{VMName: v1alpha1.LocalName(vm), Location: stack.LocationName}}
		for _, e := range edit {
			e(b)
		}
		h.create(t, b)
		return b
	}
	await := func(t *testing.T, name string, p v1alpha1.BackupPhase) *v1alpha1.VirtualMachineBackup {
		t.Helper()
		b := &v1alpha1.VirtualMachineBackup{}
		require.Eventually(t, func() bool {
			return h.kube.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, b) == nil && b.Status.Phase == p
		}, time.Minute, 100*time.Millisecond, "backup %s reaches %s", name, p)
		return b
	}
	vm := func(name, disk string) *v1alpha1.VirtualMachine {
		v := vmWith(name, disk)
		v.Spec.ForProvider.VirtualNetworks = nil
		return v
	}
	h.create(t, volume("web-root"))
	h.create(t, vm("web", "web-root"))
	web := h.wait(t, "web", time.Minute, running)

	store, err := backupstore.Open(ctx, backupstore.Location{Endpoint: h.s.ObjectStore.Endpoint, Region: h.s.ObjectStore.Region, Bucket: stack.LocationBucket, AccessKey: h.s.ObjectStore.AccessKey, SecretKey: h.s.ObjectStore.SecretKey})
	require.NoError(t, err)

	var first *v1alpha1.VirtualMachineBackup
	t.Run("TheFirstBackupIsFullAndTheNextReadsOnlyWhatChanged", func(t *testing.T) {
		backupOf("web-1", "web")
		first = await(t, "web-1", v1alpha1.BackupSucceeded)
		assert.True(t, first.Status.Full)
		assert.Equal(t, string(web.UID), first.Status.SourceUID)
		assert.Equal(t, web.Status.AtProvider.Node, first.Status.Node)
		assert.Positive(t, first.Status.BytesWritten)
		assert.Positive(t, first.Status.ChunksWritten)
		h.assertEvent(t, "web-1", "BackupTaken", "(full)")

		out, err := h.plugin("backup", "web", "--location", stack.LocationName, "--name", "web-2", "--wait", "1m")
		require.NoError(t, err, out)
		assert.Contains(t, out, "VirtualMachineBackup "+ns+"/web-2 succeeded")
		second := await(t, "web-2", v1alpha1.BackupSucceeded)
		assert.False(t, second.Status.Full)
		assert.Equal(t, string(first.UID), second.Status.Parent)
		assert.Zero(t, second.Status.BytesRead, "nothing was written since the first")
		assert.Zero(t, second.Status.BytesWritten)

		all, err := store.Backups(ctx, ns)
		require.NoError(t, err)
		assert.Len(t, all, 2, "both backups are whole in the store")
		v, err := store.Verify(ctx, all[1], nil)
		require.NoError(t, err)
		assert.Empty(t, v.Bad, "every chunk of the incremental backup reads back as named")
	})

	t.Run("AVMIsMadeAgainFromABackup", func(t *testing.T) {
		require.NotNil(t, first)
		format := v1alpha1.DiskFormatRaw
		h.create(t, &v1alpha1.DiskImage{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web-restored"}, Spec: v1alpha1.DiskImageSpec{ForProvider: v1alpha1.DiskImageParameters{
			Format: &format,
			Source: v1alpha1.DiskImageSource{Backup: &v1alpha1.DiskImageBackupSource{Location: stack.LocationName, ID: string(first.UID)}},
		}}})
		h.create(t, &v1alpha1.Volume{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web-again-root"}, Spec: v1alpha1.VolumeSpec{ForProvider: v1alpha1.VolumeParameters{
			Size: resource.MustParse("1Gi"), Source: &v1alpha1.VolumeSource{DiskImageRef: &v1alpha1.LocalReference{Name: "web-restored"}},
		}}})
		h.create(t, vm("web-again", "web-again-root"))
		h.wait(t, "web-again", time.Minute, running)
	})

	t.Run("ThePluginMakesANewVMFromABackup", func(t *testing.T) {
		require.NotNil(t, first)
		out, err := h.plugin("restore", "web-copy", "--backup", "web-1", "--wait", "1m")
		require.NoError(t, err, out)
		for _, made := range []string{"DiskImage " + ns + "/web-copy-root created", "Volume " + ns + "/web-copy-root created", "VirtualMachine " + ns + "/web-copy created", "succeeded"} {
			assert.Contains(t, out, made)
		}
		img := h.diskImage(t, "web-copy-root")
		require.NotNil(t, img.Spec.ForProvider.Source.Backup)
		assert.Equal(t, v1alpha1.DiskImageBackupSource{Location: stack.LocationName, ID: string(first.UID), Disk: "root"}, *img.Spec.ForProvider.Source.Backup)
		copied := h.wait(t, "web-copy", time.Minute, running)
		assert.Equal(t, []v1alpha1.DiskAttachment{{Name: "web-copy-root"}}, copied.Spec.ForProvider.DiskAttachments)
		assert.Equal(t, web.Spec.ForProvider.Memory, copied.Spec.ForProvider.Memory, "the backed-up VM's shape")

		for name, args := range map[string][]string{
			"a backup that does not exist": {"restore", "nope", "--backup", "no-such-backup"},
			"a snapshot and a backup":      {"restore", "nope", "--backup", "web-1", "--snapshot", "s"},
			"a VM name taken":              {"restore", "web", "--backup", "web-1"},
		} {
			out, err := h.plugin(args...)
			assert.Error(t, err, "%s: %s", name, out)
		}
		err = h.kube.Get(ctx, types.NamespacedName{Namespace: ns, Name: "web-root"}, &v1alpha1.DiskImage{})
		assert.True(t, kerrors.IsNotFound(err), "a refused restore makes nothing: %v", err)
	})

	t.Run("ANamespaceNotGrantedTheLocationWaitsSayingSo", func(t *testing.T) {
		const tenant = "tenant-b"
		require.NoError(t, h.kube.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: tenant}}))
		vol := volume("db-root")
		vol.Namespace = tenant
		h.create(t, vol)
		v := vm("db", "db-root")
		v.Namespace = tenant
		h.create(t, v)
		b := &v1alpha1.VirtualMachineBackup{ObjectMeta: metav1.ObjectMeta{Namespace: tenant, Name: "db-1"}, Spec: v1alpha1.VirtualMachineBackupSpec{VMName: "db", Location: stack.LocationName}}
		h.create(t, b)
		require.Eventually(t, func() bool {
			err := h.kube.Get(ctx, types.NamespacedName{Namespace: tenant, Name: "db-1"}, b)
			return err == nil && b.Status.Phase == v1alpha1.BackupPending && strings.Contains(b.Status.Message, "backupLocations: ["+stack.LocationName+"]")
		}, time.Minute, 100*time.Millisecond, "the backup waits for a grant; last %+v", b.Status)
	})

	t.Run("AnotherNamespacesBackupIsRestoredOnlyWhereGranted", func(t *testing.T) {
		// A tenant granted the shared location, with another namespace's
		// backup id in hand: naming that namespace is refused until an
		// administrator grants restoreFrom (how a namespace that is gone
		// comes back in another).
		require.NotNil(t, first)
		const tenant = "tenant-c"
		require.NoError(t, h.kube.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: tenant}}))
		grant := func(g apisv1alpha1.TenantGrant) {
			cpc := &apisv1alpha1.ClusterProviderConfig{}
			require.NoError(t, h.kube.Get(ctx, types.NamespacedName{Name: "default"}, cpc))
			cpc.Spec.Grants = append(cpc.Spec.Grants, g)
			require.NoError(t, h.kube.Update(ctx, cpc))
		}
		grant(apisv1alpha1.TenantGrant{Namespaces: []string{tenant}, BackupLocations: []string{stack.LocationName}})
		format := v1alpha1.DiskFormatRaw
		h.create(t, &v1alpha1.DiskImage{ObjectMeta: metav1.ObjectMeta{Namespace: tenant, Name: "theirs"}, Spec: v1alpha1.DiskImageSpec{ForProvider: v1alpha1.DiskImageParameters{
			Format: &format,
			Source: v1alpha1.DiskImageSource{Backup: &v1alpha1.DiskImageBackupSource{Location: stack.LocationName, Namespace: ns, ID: string(first.UID)}},
		}}})
		h.create(t, &v1alpha1.Volume{ObjectMeta: metav1.ObjectMeta{Namespace: tenant, Name: "theirs-root"}, Spec: v1alpha1.VolumeSpec{ForProvider: v1alpha1.VolumeParameters{
			Size: resource.MustParse("1Gi"), Source: &v1alpha1.VolumeSource{DiskImageRef: &v1alpha1.LocalReference{Name: "theirs"}},
		}}})
		v := vm("thief", "theirs-root")
		v.Namespace = tenant
		h.create(t, v)
		get := func() *v1alpha1.VirtualMachine {
			got := &v1alpha1.VirtualMachine{}
			require.NoError(t, h.kube.Get(ctx, types.NamespacedName{Namespace: tenant, Name: "thief"}, got))
			return got
		}
		require.Eventually(t, func() bool {
			return strings.Contains(get().GetCondition(xpv2.TypeSynced).Message, "refused: the DiskImage restores a backup of namespace \""+ns+"\"")
		}, time.Minute, 100*time.Millisecond, "the VM is refused naming the grant")
		got := get()
		assert.Contains(t, got.GetCondition(xpv2.TypeSynced).Message, "(restoreFrom: ["+ns+"])")
		assert.Empty(t, got.Status.AtProvider.Node, "nothing of it reached a node")

		grant(apisv1alpha1.TenantGrant{Namespaces: []string{tenant}, RestoreFrom: []string{ns}})
		require.Eventually(t, func() bool { return running(get()) }, time.Minute, 100*time.Millisecond, "the VM runs once the administrator granted it")
	})

	// Last: it damages the store that the subtests above read.
	t.Run("AVerificationFindsAChunkCorruptedInTheStore", func(t *testing.T) {
		require.NotNil(t, first)
		out, err := h.plugin("backup", "verify", "web-1", "--name", "web-1-clean", "--wait", "1m")
		require.NoError(t, err, out)
		assert.Contains(t, out, "VirtualMachineBackupVerification "+ns+"/web-1-clean succeeded")

		m, err := store.Manifest(ctx, ns, string(first.UID))
		require.NoError(t, err)
		require.NotEmpty(t, m.Disks)
		require.NotEmpty(t, m.Disks[0].Extents)
		bad := m.Disks[0].Extents[0]
		s3, err := h.s.ObjectStore.Client()
		require.NoError(t, err)
		// A chunk's object, as backupstore lays it out under the location's
		// empty prefix, overwritten with other content.
		key := "chunks/" + bad.Chunk[:4] + "/" + bad.Chunk
		junk := []byte("not what was backed up")
		_, err = s3.PutObject(ctx, stack.LocationBucket, key, bytes.NewReader(junk), int64(len(junk)), minio.PutObjectOptions{})
		require.NoError(t, err)

		out, err = h.plugin("backup", "verify", "web-1", "--name", "web-1-corrupt", "--wait", "1m")
		require.Error(t, err, out)
		assert.Contains(t, out+err.Error(), fmt.Sprintf("disk %s, bytes %d-%d (chunk %s): its content does not match its name", m.Disks[0].Name, bad.Offset, bad.Offset+bad.Length, bad.Chunk))
		got := &v1alpha1.VirtualMachineBackup{}
		require.NoError(t, h.kube.Get(ctx, types.NamespacedName{Namespace: ns, Name: "web-1"}, got))
		require.NotNil(t, got.Status.LastVerification)
		assert.Equal(t, v1alpha1.BackupCorrupt, got.Status.LastVerification.Result)
		h.assertEvent(t, "web-1", "BackupCorrupt", "of backup "+string(first.UID))
	})
}
