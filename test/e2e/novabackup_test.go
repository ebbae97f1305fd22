package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/harness/guesthost"
	"github.com/virtfleet/virtfleet/internal/harness/guestimage"
	"github.com/virtfleet/virtfleet/internal/harness/stack"
)

// realGuest is the guest testRealNovaGuest booted on the real compute
// host, and how to reach it.
type realGuest struct {
	// vm is the VirtualMachine's name, ip its address on the network
	// whose DHCP namespace netns is; key the private key's file and pub
	// the public key.
	vm, ip, netns, key, pub string
}

// ssh runs command in the guest at ip as the image's user, trying until
// it answers.
func (g realGuest) ssh(ctx context.Context, ip, command string) (string, error) {
	return guesthost.SSHUntil(ctx, g.netns, g.key, guestimage.DefaultUser, ip, command, 2*time.Second, 10*time.Minute)
}

// testRealNovaBackup backs the real guest up, through the nova agent, to
// the stack's S3 store, then makes a new VM from the backup on the same
// real compute host, as a user would: a DiskImage of the backup's root
// disk, a Volume of it, a VirtualMachine booting from that. A file
// written in the first guest before its backup reads back, over ssh, with
// the same sha256 in the second. The first guest is stopped before the
// second boots: the restore needs nothing of it.
func testRealNovaBackup(t *testing.T, h *hub, on func(*v1alpha1.VirtualMachine) *v1alpha1.VirtualMachine, g realGuest) {
	ctx := context.Background()
	var sum string
	var backup v1alpha1.VirtualMachineBackup
	t.Run("ABackupOfTheRealGuestSucceeds", func(t *testing.T) {
		// Synced before the backup: Cinder's snapshot is of the disk.
		out, err := g.ssh(ctx, g.ip, "head -c 16M /dev/urandom > backed-up && sync && sha256sum backed-up")
		require.NoError(t, err, "ssh: %s", out)
		sum = sha(t, out, "backed-up")

		h.create(t, &v1alpha1.VirtualMachineBackup{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: g.vm + "-1"},
			Spec:       v1alpha1.VirtualMachineBackupSpec{VMName: v1alpha1.LocalName(g.vm), Location: stack.LocationName},
		})
		start := time.Now()
		require.Eventually(t, func() bool {
			err := h.kube.Get(ctx, types.NamespacedName{Namespace: ns, Name: g.vm + "-1"}, &backup)
			return err == nil && (backup.Status.Phase == v1alpha1.BackupSucceeded || backup.Status.Phase == v1alpha1.BackupFailed)
		}, 20*time.Minute, time.Second, "the backup ends; last status %+v", &backup.Status)
		require.Equal(t, v1alpha1.BackupSucceeded, backup.Status.Phase, backup.Status.Message)
		st := backup.Status
		t.Logf("backup of the real guest succeeded %s after it was created (%d ms by its status): disks %s, %d bytes read, %d bytes in %d chunks written, %d chunks reused",
			time.Since(start).Round(time.Millisecond), st.DurationMilliseconds, st.Size, st.BytesRead, st.BytesWritten, st.ChunksWritten, st.ChunksReused)
		assert.True(t, st.Full, "Cinder tracks no changed blocks: every backup on nova is full")
		assert.False(t, st.Frozen)
		assert.Positive(t, st.BytesWritten)
		assert.Positive(t, st.ChunksWritten)
	})

	t.Run("ANewVMFromTheBackupBootsWithTheFile", func(t *testing.T) {
		require.NotEmpty(t, sum, "the backup was taken")
		h.patch(t, g.vm, func(vm *v1alpha1.VirtualMachine) { vm.Spec.ForProvider.Running = ptr(false) })
		h.wait(t, g.vm, 5*time.Minute, phase(v1alpha1.PhaseStopped))

		format := v1alpha1.DiskFormatRaw
		h.create(t, &v1alpha1.DiskImage{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: g.vm + "-restored"}, Spec: v1alpha1.DiskImageSpec{ForProvider: v1alpha1.DiskImageParameters{
			Format: &format,
			Source: v1alpha1.DiskImageSource{Backup: &v1alpha1.DiskImageBackupSource{Location: stack.LocationName, ID: string(backup.UID)}},
		}}})
		root := imageVolume(g.vm+"-again-root", g.vm+"-restored")
		root.Spec.ForProvider.Size = resource.MustParse("3Gi")
		h.create(t, root)
		vm := vmWith(g.vm+"-again", g.vm+"-again-root")
		vm.Spec.ForProvider.VirtualNetworks = []v1alpha1.LocalName{"lan"}
		vm.Spec.ForProvider.Memory = resource.MustParse("768Mi")
		vm = on(vm)
		vm.Spec.ForProvider.PublicKey = g.pub
		defer guestimage.HoldBoot(ctx, t)()
		start := time.Now()
		h.create(t, vm)
		t.Cleanup(func() { h.delete(t, g.vm+"-again") })

		got := h.wait(t, g.vm+"-again", 20*time.Minute, func(vm *v1alpha1.VirtualMachine) bool {
			return running(vm) && len(vm.Status.AtProvider.Interfaces) == 1 && len(vm.Status.AtProvider.Interfaces[0].IPs) > 0
		})
		t.Logf("the VM from the backup is Running on %s %s after it was created", got.Status.AtProvider.Node, time.Since(start).Round(time.Millisecond))
		ip := got.Status.AtProvider.Interfaces[0].IPs[0]
		out, err := g.ssh(ctx, ip, "sha256sum backed-up")
		require.NoError(t, err, "ssh into the VM from the backup at %s: %s", ip, out)
		t.Logf("ssh into the VM from the backup %s after it was created: %s", time.Since(start).Round(time.Millisecond), out)
		assert.Equal(t, sum, sha(t, out, "backed-up"), "the file written before the backup")
	})
}
