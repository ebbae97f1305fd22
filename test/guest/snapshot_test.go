package guest

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/harness/guesthost"
	"github.com/virtfleet/virtfleet/internal/harness/guestimage"
)

// counter counts in memory only (/dev/shm is a tmpfs): what it holds after
// a restore can have come from nowhere but the snapshot's memory.
// It runs in a subshell of its own and holds none of ssh's descriptors, or
// ssh would wait for it to end.
const counter = `(setsid sh -c 'i=0; while :; do i=$((i+1)); echo $i > /dev/shm/counter; sleep 0.5; done' </dev/null >/dev/null 2>&1 &)`

// snapshotWithMemory takes a snapshot of the running guest with its memory,
// changes the guest, and restores it: the marker file on disk, the boot and
// a process's count in memory are the snapshot's again, and the guest ran
// on without booting.
func (g *suite) snapshotWithMemory(name, bootID string) func(t *testing.T) {
	return func(t *testing.T) {
		ip := address(g.get(t, name))
		restarts := g.get(t, name).Status.AtProvider.RestartCount
		g.sshUntil(t, ip, "echo before > marker && sync && "+counter, time.Minute)
		atSnapshot := g.count(t, ip, 0)

		g.create(&v1alpha1.VirtualMachineSnapshot{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-mem"},
			Spec:       v1alpha1.VirtualMachineSnapshotSpec{VMName: v1alpha1.LocalName(name), IncludeMemory: true},
		})
		s := g.waitSnapshot(t, name+"-mem")
		require.Equal(t, v1alpha1.SnapshotSucceeded, s.Status.Phase, s.Status.Message)
		t.Logf("%s: snapshot with memory taken in %d ms, %v", name, s.Status.DurationMilliseconds, s.Status.Size)
		assert.True(t, s.Status.Memory)
		taken := g.count(t, ip, atSnapshot)

		g.sshUntil(t, ip, "echo after > marker && sync", time.Minute)
		past := g.count(t, ip, taken+40) // twenty seconds on: more than an ssh after the restore takes

		// The guest comes back knowing no connection made since the
		// snapshot.
		guesthost.SSHDisconnect(g.ctx, g.host.Netns, g.key, guestimage.DefaultUser, ip)
		g.create(&v1alpha1.VirtualMachineRestore{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-back"},
			Spec:       v1alpha1.VirtualMachineRestoreSpec{SnapshotName: v1alpha1.LocalName(name + "-mem")},
		})
		r := &v1alpha1.VirtualMachineRestore{}
		require.NoError(t, wait.PollUntilContextTimeout(g.ctx, time.Second, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
			return g.kube.Get(ctx, types.NamespacedName{Namespace: ns, Name: name + "-back"}, r) == nil && r.Done(), nil
		}), "restore %s: last status %+v", name+"-back", r.Status)
		require.Equal(t, v1alpha1.RestoreSucceeded, r.Status.Phase, r.Status.Message)
		t.Logf("%s: restored in %d ms", name, r.Status.DurationMilliseconds)

		out := g.sshUntil(t, ip, "cat marker /proc/sys/kernel/random/boot_id /dev/shm/counter", time.Minute)
		f := strings.Fields(out)
		require.Len(t, f, 3, out)
		assert.Equal(t, "before", f[0], "the disk is the snapshot's")
		assert.Equal(t, bootID, f[1], "the same boot: the guest was resumed, not booted")
		n, err := strconv.Atoi(f[2])
		require.NoError(t, err, out)
		assert.GreaterOrEqual(t, n, atSnapshot, "the count went on from the snapshot's")
		assert.Less(t, n, past, "the count went back to the snapshot's: it came from the snapshot's memory")
		g.count(t, ip, n+1) // and the counting process lives on
		assert.Equal(t, restarts, g.get(t, name).Status.AtProvider.RestartCount, "a resumed guest did not restart")

		require.NoError(t, g.kube.Delete(g.ctx, s))
		require.NoError(t, wait.PollUntilContextTimeout(g.ctx, time.Second, time.Minute, true, func(ctx context.Context) (bool, error) {
			return kerrors.IsNotFound(g.kube.Get(ctx, types.NamespacedName{Namespace: ns, Name: s.Name}, &v1alpha1.VirtualMachineSnapshot{})), nil
		}), "the snapshot is deleted from the node and the API")
	}
}

// count waits until the guest's counter is at least min and returns it.
// The guest counts in its own time, which a TCG guest on a busy host spends
// slower than the host's: the wait is for the count, not for a time.
func (g *suite) count(t *testing.T, ip string, min int) int {
	t.Helper()
	var n int
	var last string
	err := wait.PollUntilContextTimeout(g.ctx, 500*time.Millisecond, 4*time.Minute, true, func(context.Context) (bool, error) {
		out, err := g.ssh(ip, "cat /dev/shm/counter")
		last = out
		if err != nil {
			return false, nil
		}
		n, err = strconv.Atoi(strings.TrimSpace(out))
		return err == nil && n >= min, nil
	})
	require.NoError(t, err, "the guest's counter did not reach %d: %q", min, last)
	return n
}

// waitSnapshot waits until the snapshot name is done.
func (g *suite) waitSnapshot(t *testing.T, name string) *v1alpha1.VirtualMachineSnapshot {
	t.Helper()
	s := &v1alpha1.VirtualMachineSnapshot{}
	err := wait.PollUntilContextTimeout(g.ctx, time.Second, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		return g.kube.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, s) == nil && s.Done(), nil
	})
	require.NoError(t, err, fmt.Sprintf("snapshot %s: last status %+v", name, s.Status))
	return s
}

// snapshotHoldsTheGuest takes a disk-only snapshot of the running VM name,
// at ip on node, while the guest at peer on node peerNode pings it: the guest agent freezes
// its filesystems for it, and the pings show how long the guest stood
// still. A live migration of the VM is then refused, naming the snapshot,
// which its node's disks hold; once the snapshot is deleted nothing holds
// the VM any more.
func (g *suite) snapshotHoldsTheGuest(t *testing.T, name, ip, node, peer, peerNode string) {
	lastReply, stop := g.on(peerNode).pingStream(t, peer, ip)
	require.Eventually(t, func() bool { return !lastReply().IsZero() }, time.Minute, 100*time.Millisecond, "the other guest's pings are answered before the snapshot")
	snap := name + "-disks"
	g.create(&v1alpha1.VirtualMachineSnapshot{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: snap},
		Spec:       v1alpha1.VirtualMachineSnapshotSpec{VMName: v1alpha1.LocalName(name)},
	})
	s := g.waitSnapshot(t, snap)
	require.Equal(t, v1alpha1.SnapshotSucceeded, s.Status.Phase, s.Status.Message)
	require.Eventually(t, func() bool { return lastReply().After(s.Status.CreationTime.Add(time.Second)) }, time.Minute, 100*time.Millisecond,
		"the other guest's pings are answered after the snapshot")
	n, gap := lost(stop())
	t.Logf("%s: disk-only snapshot in %d ms, %v; %d echo requests of the other guest lost, longest gap between replies %s",
		name, s.Status.DurationMilliseconds, s.Status.Size, n, gap.Round(10*time.Millisecond))
	assert.True(t, s.Status.Frozen, "the guest agent froze the filesystems")
	assert.Contains(t, s.Status.Indications, v1alpha1.IndicationGuestAgent)
	assert.False(t, s.Status.Memory, "a disk-only snapshot")
	assert.Equal(t, node, s.Status.Node)

	g.create(&v1alpha1.VirtualMachineMigration{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-held"},
		Spec:       v1alpha1.VirtualMachineMigrationSpec{VMName: v1alpha1.LocalName(name)},
	})
	m := &v1alpha1.VirtualMachineMigration{}
	require.NoError(t, wait.PollUntilContextTimeout(g.ctx, time.Second, time.Minute, true, func(ctx context.Context) (bool, error) {
		return g.kube.Get(ctx, types.NamespacedName{Namespace: ns, Name: name + "-held"}, m) == nil && m.Done(), nil
	}), "migration %s: last status %+v", name+"-held", m.Status)
	assert.Equal(t, v1alpha1.MigrationFailed, m.Status.Phase)
	assert.Contains(t, m.Status.Message, snap, "the refusal names the snapshot")
	assert.Equal(t, node, g.get(t, name).Status.AtProvider.Node, "the VM stays with its snapshot")

	require.NoError(t, g.kube.Delete(g.ctx, s))
	require.NoError(t, wait.PollUntilContextTimeout(g.ctx, time.Second, time.Minute, true, func(ctx context.Context) (bool, error) {
		return kerrors.IsNotFound(g.kube.Get(ctx, types.NamespacedName{Namespace: ns, Name: snap}, &v1alpha1.VirtualMachineSnapshot{})), nil
	}), "the snapshot is deleted from the node and the API")
}
