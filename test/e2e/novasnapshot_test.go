package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/harness/guestimage"
)

// testRealNovaSnapshot keeps the real guest's disk in a snapshot (Cinder's,
// taken through Nova's createImage), overwrites a file the guest wrote
// before it, and restores the snapshot into the VM, as a user would: a
// VirtualMachineSnapshot, then a VirtualMachineRestore. Nova reverts no
// volume in place, so the restore deletes the server, reverts its volume
// and boots a new server from it: the file reads back, over ssh, as it was
// at the snapshot. It returns g at the guest's address after the restore.
func testRealNovaSnapshot(t *testing.T, h *hub, g realGuest) realGuest {
	ctx := context.Background()
	const file = "kept"
	var before string
	var snapshot v1alpha1.VirtualMachineSnapshot
	t.Run("ASnapshotOfTheRealGuestKeepsItsDisk", func(t *testing.T) {
		// Synced before the snapshot, as a guest without a frozen
		// filesystem needs for its data to be in the volume.
		out, err := g.ssh(ctx, g.ip, "head -c 4M /dev/urandom > "+file+" && sync && sha256sum "+file)
		require.NoError(t, err, "ssh: %s", out)
		before = sha(t, out, file)

		name := g.vm + "-kept"
		h.create(t, &v1alpha1.VirtualMachineSnapshot{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec:       v1alpha1.VirtualMachineSnapshotSpec{VMName: v1alpha1.LocalName(g.vm)},
		})
		start := time.Now()
		require.Eventually(t, func() bool {
			return h.kube.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &snapshot) == nil && snapshot.Done()
		}, 10*time.Minute, time.Second, "the snapshot ends; last status %+v", &snapshot.Status)
		require.Equal(t, v1alpha1.SnapshotSucceeded, snapshot.Status.Phase, snapshot.Status.Message)
		assert.True(t, snapshot.Status.ReadyToUse)
		assert.Contains(t, snapshot.Status.Indications, v1alpha1.IndicationOnline, "taken while the guest ran")
		assert.False(t, snapshot.Status.Memory, "Nova keeps no guest memory")
		t.Logf("snapshot of the real guest succeeded %s after it was created (frozen: %t, size %s)",
			time.Since(start).Round(time.Millisecond), snapshot.Status.Frozen, snapshot.Status.Size)

		out, err = g.ssh(ctx, g.ip, "head -c 4M /dev/urandom > "+file+" && sync && sha256sum "+file)
		require.NoError(t, err, "ssh: %s", out)
		require.NotEqual(t, before, sha(t, out, file), "the file is overwritten after the snapshot")
	})

	t.Run("TheRestoredGuestBootsWithTheFileAsAtTheSnapshot", func(t *testing.T) {
		require.NotEmpty(t, before, "the snapshot was taken")
		vm := h.get(t, g.vm)
		name := g.vm + "-back"
		// The restore boots a new server.
		defer guestimage.HoldBoot(ctx, t)()
		h.create(t, &v1alpha1.VirtualMachineRestore{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec:       v1alpha1.VirtualMachineRestoreSpec{SnapshotName: v1alpha1.LocalName(snapshot.Name)},
		})
		start := time.Now()
		r := &v1alpha1.VirtualMachineRestore{}
		require.Eventually(t, func() bool {
			return h.kube.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, r) == nil &&
				(r.Status.Phase == v1alpha1.RestoreSucceeded || r.Status.Phase == v1alpha1.RestoreFailed)
		}, 15*time.Minute, time.Second, "the restore ends; last status %+v", &r.Status)
		require.Equal(t, v1alpha1.RestoreSucceeded, r.Status.Phase, r.Status.Message)
		assert.True(t, r.Status.Complete)
		assert.Equal(t, string(vm.UID), r.Status.TargetUID)

		got := h.wait(t, g.vm, 15*time.Minute, func(vm *v1alpha1.VirtualMachine) bool {
			return running(vm) && vm.GetAnnotations()[v1alpha1.AnnotationRestore] == "" &&
				len(vm.Status.AtProvider.Interfaces) == 1 && len(vm.Status.AtProvider.Interfaces[0].IPs) > 0
		})
		assert.NotEqual(t, vm.Status.AtProvider.ID, got.Status.AtProvider.ID, "Nova reverts a volume only without its server: the guest is a new server")
		g.ip = got.Status.AtProvider.Interfaces[0].IPs[0]
		out, err := g.ssh(ctx, g.ip, "sha256sum "+file)
		require.NoError(t, err, "ssh into the restored guest at %s: %s", g.ip, out)
		t.Logf("ssh into the restored guest %s after the restore was created", time.Since(start).Round(time.Millisecond))
		assert.Equal(t, before, sha(t, out, file), "the file as it was at the snapshot")
	})
	return g
}

// sha is the sum sha256sum printed for file in out.
func sha(t *testing.T, out, file string) string {
	t.Helper()
	fields := strings.Fields(out)
	require.Len(t, fields, 2, "sha256sum says: %s", out)
	require.Equal(t, file, fields[1], "sha256sum says: %s", out)
	return fields[0]
}
