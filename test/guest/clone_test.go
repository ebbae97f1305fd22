package guest

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/harness/stack"
)

// cloneElsewhere clones VM name, running at ip on node from, through a
// backup, while it runs on: the new VM runs on node to with an identity of
// its own (its address, its hostname, its cloud-init instance id), its
// disk the source's at the clone (a mark written before it is there), and
// reaches the source over the network. Node from takes no VM while the
// clone is placed, so that it must land on the other host. The new VM
// and its disk are deleted after.
func (g *suite) cloneElsewhere(t *testing.T, name, ip, from, to string) {
	const target = "twin"
	mark := "written on " + from + " at " + time.Now().UTC().Format(time.RFC3339Nano)
	g.on(from).sshUntil(t, ip, "echo '"+mark+"' | sudo tee /var/tmp/vf-clone >/dev/null && sync", time.Minute)
	g.unschedulable(t, from, true)
	defer g.unschedulable(t, from, false)

	created := time.Now()
	c := &v1alpha1.VirtualMachineClone{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: target},
		Spec: v1alpha1.VirtualMachineCloneSpec{
			Source:         v1alpha1.CloneSource{Name: v1alpha1.LocalName(name)},
			Target:         v1alpha1.CloneTarget{Name: target},
			BackupLocation: stack.LocationName,
		},
	}
	g.create(c)
	defer func() {
		g.deleteAndWait(t, &v1alpha1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: target}})
		for _, d := range c.Status.Disks {
			g.deleteAndWait(t, &v1alpha1.Volume{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: d.Volume}})
		}
	}()
	v, twin := g.on(to).waitRunningWithAddress(t, target, created)
	t.Logf("%s: cloned through a backup, running with ssh on %s %s after the clone's create", target, to, time.Since(created).Round(time.Second))
	g.unschedulable(t, from, false)
	assert.Equal(t, to, v.Status.AtProvider.Node)
	assert.NotEqual(t, ip, twin, "an address of its own")

	require.NoError(t, wait.PollUntilContextTimeout(g.ctx, time.Second, time.Minute, true, func(ctx context.Context) (bool, error) {
		return g.kube.Get(ctx, types.NamespacedName{Namespace: ns, Name: target}, c) == nil && c.Done(), nil
	}), "clone %s: last status %+v", target, c.Status)
	assert.Equal(t, v1alpha1.CloneSucceeded, c.Status.Phase, c.Status.Message)
	assert.Equal(t, to, c.Status.Node)
	assert.Equal(t, target, c.Status.Backup)

	b := g.on(to)
	out := b.sshUntil(t, twin, "hostname; cat /var/lib/cloud/data/instance-id; cat /var/tmp/vf-clone", time.Minute)
	lines := strings.Split(out, "\n")
	require.Len(t, lines, 3, out)
	assert.Equal(t, target, lines[0], "its own hostname")
	assert.Equal(t, string(v.UID), lines[1], "its own cloud-init instance")
	assert.Equal(t, mark, lines[2], "the source's disk at the clone")
	b.sshUntil(t, twin, ping(ip, defaultPayload), reachTimeout)
	src := g.get(t, name)
	assert.True(t, running(src), "the source runs on")
	assert.Equal(t, from, src.Status.AtProvider.Node)
}

// unschedulable cordons node, or ends its cordon.
func (g *suite) unschedulable(t *testing.T, node string, cordon bool) {
	t.Helper()
	require.Eventually(t, func() bool {
		n := &v1alpha1.HypervisorNode{}
		if err := g.kube.Get(g.ctx, types.NamespacedName{Name: node}, n); err != nil {
			return false
		}
		if n.Spec.Unschedulable == cordon {
			return true
		}
		n.Spec.Unschedulable = cordon
		return g.kube.Update(g.ctx, n) == nil
	}, 30*time.Second, 100*time.Millisecond, "cannot set %s unschedulable: %v", node, cordon)
}
