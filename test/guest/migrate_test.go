package guest

import (
	"bufio"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/harness/guesthost"
	"github.com/virtfleet/virtfleet/internal/harness/guestimage"
)

// migrationTimeout bounds one live migration of a guest with its disk
// between the two hosts on a busy machine.
const migrationTimeout = 10 * time.Minute

// maxLost is how many of the echo requests the other guest sends every
// 200 ms may go unanswered while a guest moves: the switch-over pauses it
// for a fraction of a second, and its first frames on the target teach the
// network where it is.
const maxLost = 10

// reply is an echo reply's sequence number and when its line arrived.
type reply struct {
	seq int
	at  time.Time
}

// pingStream runs pingStreamScript in the guest at from, pinging to, and
// records the replies: last says when the latest came, stop ends the
// stream and returns them all.
func (g *suite) pingStream(t *testing.T, from, to string) (last func() time.Time, stop func() []reply) {
	t.Helper()
	ctx, cancel := context.WithCancel(g.ctx)
	cmd := guesthost.SSHCommand(ctx, g.host.Netns, g.key, guestimage.DefaultUser, from, fmt.Sprintf("sudo %s %s %d", pingStreamPath, to, defaultPayload))
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	var (
		mu      sync.Mutex
		replies []reply
		closed  = make(chan struct{})
	)
	go func() {
		defer close(closed)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if seq, err := strconv.Atoi(strings.TrimSpace(sc.Text())); err == nil {
				mu.Lock()
				replies = append(replies, reply{seq: seq, at: time.Now()})
				mu.Unlock()
			}
		}
	}()
	last = func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		if len(replies) == 0 {
			return time.Time{}
		}
		return replies[len(replies)-1].at
	}
	return last, func() []reply {
		cancel()
		<-closed
		_ = cmd.Wait()
		mu.Lock()
		defer mu.Unlock()
		return replies
	}
}

// lost counts the echo requests between the first and the last reply
// that got none, and the longest time between two replies.
func lost(replies []reply) (n int, gap time.Duration) {
	if len(replies) == 0 {
		return 0, 0
	}
	got := map[int]bool{}
	for i, r := range replies {
		got[r.seq] = true
		if i > 0 {
			gap = max(gap, r.at.Sub(replies[i-1].at))
		}
	}
	for seq := replies[0].seq; seq <= replies[len(replies)-1].seq; seq++ {
		if !got[seq] {
			n++
		}
	}
	return n, gap
}

// waitMigration waits for the migration name to end, and requires it
// succeeded.
func (g *suite) waitMigration(t *testing.T, name string) *v1alpha1.VirtualMachineMigration {
	t.Helper()
	m := &v1alpha1.VirtualMachineMigration{}
	err := wait.PollUntilContextTimeout(g.ctx, time.Second, migrationTimeout, true, func(ctx context.Context) (bool, error) {
		if err := g.kube.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, m); err != nil {
			return false, nil
		}
		return m.Done(), nil
	})
	require.NoError(t, err, "migration %s did not end; last status %+v", name, m.Status)
	require.Equal(t, v1alpha1.MigrationSucceeded, m.Status.Phase, m.Status.Message)
	took := "?"
	if m.Status.StartTime != nil && m.Status.EndTime != nil {
		took = m.Status.EndTime.Sub(m.Status.StartTime.Time).Round(100 * time.Millisecond).String()
	}
	t.Logf("migration %s: %s -> %s in %s, %d of %d MiB transferred, downtime %d ms (as libvirt reports it)", name,
		m.Status.SourceNode, m.Status.TargetNode, took, m.Status.TransferredBytes>>20, m.Status.TotalBytes>>20, m.Status.DowntimeMilliseconds)
	return m
}

// migrate moves the running VM name, at ip on node from, live to node to
// with a VirtualMachineMigration, and checks what moved and what did not:
// the same boot, address and restart count, the domain and the Volume's
// disk on to and nothing of the guest left on from, and the pings of the
// other guest, at peer on node to, answered throughout but for a few.
func (g *suite) migrate(t *testing.T, name, ip, from, to, peer string) {
	src, dst := g.on(from), g.on(to)
	before := src.facts(t, ip)
	vm := g.get(t, name)
	restarts := vm.Status.AtProvider.RestartCount

	// Guest to guest, across the overlay and then on one host: each
	// host's namespace reaches only the guests on its own bridge (the
	// network's gateway address is on both).
	lastReply, stop := dst.pingStream(t, peer, ip)
	require.Eventually(t, func() bool { return !lastReply().IsZero() }, time.Minute, 100*time.Millisecond, "the other guest's pings are answered before the move")
	asked := time.Now()
	g.create(&v1alpha1.VirtualMachineMigration{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-to-" + to},
		Spec:       v1alpha1.VirtualMachineMigrationSpec{VMName: v1alpha1.LocalName(name)},
	})
	m := g.waitMigration(t, name+"-to-"+to)
	t.Logf("%s: migrated %s after the request", name, time.Since(asked).Round(time.Second))
	assert.Equal(t, from, m.Status.SourceNode)
	assert.Equal(t, to, m.Status.TargetNode, "the only other node")
	assert.Positive(t, m.Status.TransferredBytes)

	// The target's agent reports an address once one of its own sources
	// (its guest agent channel, its ARP table) sees the guest hold it:
	// under load that can be some seconds after the switch-over.
	v := g.waitVM(t, name, time.Minute, "on node "+to+" with an address", func(v *v1alpha1.VirtualMachine) bool {
		return v.Status.AtProvider.Node == to && running(v) && v.GetAnnotations()[v1alpha1.AnnotationLeftovers] == "" && address(v) != ""
	})
	t.Logf("%s: its address reported from %s %s after the switch-over", name, to, time.Since(m.Status.EndTime.Time).Round(time.Second))
	assert.Equal(t, to, v.GetAnnotations()[v1alpha1.AnnotationNode])
	assert.Equal(t, ip, address(v), "the VM keeps its address")
	assert.Equal(t, restarts, v.Status.AtProvider.RestartCount, "a migration is no restart")
	answered := assert.Eventually(t, func() bool { return lastReply().After(m.Status.EndTime.Add(time.Second)) }, time.Minute, 100*time.Millisecond,
		"the other guest's pings are answered after the switch-over")
	n, gap := lost(stop())
	t.Logf("%s: %d echo requests of the other guest lost, longest gap between replies %s", name, n, gap.Round(10*time.Millisecond))
	if answered {
		assert.LessOrEqual(t, n, maxLost, "a few pings lost at most")
	}

	after := dst.facts(t, ip)
	assert.Equal(t, before.bootID, after.bootID, "the same boot: moved, not restarted")
	assert.Equal(t, name, after.hostname)
	assert.False(t, src.domainExists(t, vm.UID), "no domain left on %s", from)
	assert.True(t, dst.domainExists(t, vm.UID), "the domain is on %s", to)
	disk := wire.NameOnNode(ns, name+"-root")
	require.Eventually(t, func() bool {
		return !slices.Contains(src.poolVolumes(t), disk)
	}, time.Minute, time.Second, "the disk's copy on %s goes", from)
	for _, vol := range src.poolVolumes(t) {
		assert.NotContains(t, vol, string(vm.UID), "the guest's seed and swap are gone from %s", from)
	}
	assert.Contains(t, dst.poolVolumes(t), disk, "the disk is on %s", to)
	vol := &v1alpha1.Volume{}
	require.NoError(t, g.kube.Get(g.ctx, types.NamespacedName{Namespace: ns, Name: name + "-root"}, vol))
	assert.Equal(t, to, vol.GetAnnotations()[v1alpha1.AnnotationNode], "the Volume is bound to %s", to)
}

// drain drains node from and checks every VM moved to node to, each the
// same boot at the same address, and from has no VM left.
func (g *suite) drain(t *testing.T, from, to string, ips map[string]string) {
	boots := map[string]string{}
	for name, ip := range ips {
		boots[name] = g.on(from).facts(t, ip).bootID
	}
	require.Eventually(t, func() bool {
		n := &v1alpha1.HypervisorNode{}
		if err := g.kube.Get(g.ctx, types.NamespacedName{Name: from}, n); err != nil {
			return false
		}
		n.Spec.Drain = true
		return g.kube.Update(g.ctx, n) == nil
	}, 30*time.Second, 100*time.Millisecond, "drain node %s", from)
	var n v1alpha1.HypervisorNode
	err := wait.PollUntilContextTimeout(g.ctx, 2*time.Second, 2*migrationTimeout, true, func(ctx context.Context) (bool, error) {
		if err := g.kube.Get(ctx, types.NamespacedName{Name: from}, &n); err != nil {
			return false, nil
		}
		return n.Status.Drain != nil && n.Status.Drain.Phase == v1alpha1.DrainDrained && n.Status.VirtualMachines == 0, nil
	})
	require.NoError(t, err, "node %s not drained; last status %+v", from, n.Status.Drain)
	for name, ip := range ips {
		v := g.get(t, name)
		assert.Equal(t, to, v.Status.AtProvider.Node, "%s moved", name)
		assert.Equal(t, ip, address(v), "%s keeps its address", name)
		assert.Equal(t, boots[name], g.on(to).facts(t, ip).bootID, "%s: the same boot", name)
	}
	l := &v1alpha1.VirtualMachineMigrationList{}
	require.NoError(t, g.kube.List(g.ctx, l))
	for _, m := range l.Items {
		if strings.Contains(m.Name, "-drain-") {
			t.Logf("drain migration %s: %s, downtime %d ms", m.Name, m.Status.Phase, m.Status.DowntimeMilliseconds)
		}
	}
	for _, vol := range g.on(from).poolVolumes(t) {
		assert.NotContains(t, vol, ns+"_", "no Volume's disk is left on the drained node")
	}
}
