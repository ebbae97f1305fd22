package guest

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/harness/guesthost"
)

// The shared pool of TestTwoHostsOneNetwork, and the lease and margin its
// agents and hub run with: short, so that a lost host's guest moves soon.
const (
	sharedPoolName = "shared"
	haFenceAfter   = 10 * time.Second
	haMargin       = 3 * time.Second
)

// failover runs a VM with availability Restart on host A from a disk in
// the shared pool (the guest image, imported as it is), leaves a mark on
// its disk, and kills host A whole: its agent, its libvirtd and its QEMU.
// The VM runs again on host B once A's lease and the hub's margin ran out,
// from the very same disk (the mark is there), at the same address, and
// ssh reaches it.
func (g *suite) failover(t *testing.T, pair *guesthost.Pair, image, shared string) {
	a, b := g.on(nodeA), g.on(nodeB)
	const disk = "ha-root.qcow2"
	out, err := exec.CommandContext(g.ctx, "cp", "--reflink=auto", image, filepath.Join(shared, disk)).CombinedOutput() //nolint:gosec // our own paths
	require.NoError(t, err, "%s", out)
	require.NoError(t, os.Chmod(filepath.Join(shared, disk), 0o666)) //nolint:gosec // as the shared pool's other files

	vol := &v1alpha1.Volume{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "ha-root"},
		Spec: v1alpha1.VolumeSpec{ForProvider: v1alpha1.VolumeParameters{
			Size: resource.MustParse("4Gi"), StoragePool: sharedPoolName,
		}},
	}
	meta.SetExternalName(vol, disk)
	meta.AddAnnotations(vol, map[string]string{v1alpha1.AnnotationNode: nodeA})
	g.create(vol)
	v := vm("ha", g.pub, 1)
	v.Spec.ForProvider.Memory = resource.MustParse("512Mi")
	v.Spec.ForProvider.Swap = nil
	v.Spec.ForProvider.DiskAttachments = []v1alpha1.DiskAttachment{{Name: "ha-root"}}
	v.Spec.ForProvider.Availability = ptr.To(v1alpha1.AvailabilityRestart)
	meta.AddAnnotations(v, map[string]string{v1alpha1.AnnotationNode: nodeA})
	created := time.Now()
	g.create(v)
	_, ip := a.waitRunningWithAddress(t, "ha", created)
	// Reshaped live before its host dies: the VM restarts elsewhere with
	// the shape it had, not the one it was created with.
	resized := a.resize(t, "ha", a.facts(t, ip).bootID, 2, resource.MustParse("1Gi"))
	mark := "written on " + nodeA + " at " + time.Now().UTC().Format(time.RFC3339Nano)
	a.sshUntil(t, ip, "echo '"+mark+"' | sudo tee /var/tmp/vf-ha >/dev/null && sync", time.Minute)

	// The drain before left host B cordoned; it takes VMs again.
	require.Eventually(t, func() bool {
		n := &v1alpha1.HypervisorNode{}
		if err := g.kube.Get(g.ctx, types.NamespacedName{Name: nodeB}, n); err != nil {
			return false
		}
		n.Spec.Drain = false
		return g.kube.Update(g.ctx, n) == nil
	}, 30*time.Second, 100*time.Millisecond, "cannot end the drain of %s", nodeB)

	killed := time.Now()
	g.s.KillAgent(nodeA)
	pair.A.Crash()
	moved := &v1alpha1.VirtualMachine{}
	require.Eventually(t, func() bool {
		// Not b.get: a failed read here is looked at again, not fatal.
		err := g.kube.Get(g.ctx, types.NamespacedName{Namespace: ns, Name: "ha"}, moved)
		return err == nil && running(moved) && moved.Status.AtProvider.Node == nodeB
	}, bootTimeout, time.Second, "the VM runs on host B; last status %+v", &moved.Status)
	t.Logf("host A killed → VM running on host B after %s (lease %s, margin %s)", time.Since(killed).Round(time.Second), haFenceAfter, haMargin)
	got := b.sshUntil(t, ip, "cat /var/tmp/vf-ha", bootTimeout)
	assert.Equal(t, mark, got, "host B booted the disk host A wrote")
	assert.Equal(t, ip, address(b.get(t, "ha")), "the VM keeps its address")
	assert.Contains(t, moved.GetAnnotations()[v1alpha1.AnnotationRestartedFrom], nodeA+"@")
	again := b.shape(t, ip)
	assert.Equal(t, resized.cpus, again.cpus, "the vCPUs given live before the host died")
	// Not equal: the guest boots with its maximum, which is a multiple of
	// the VM's memory (domain.go), and its kernel keeps page structures
	// for all of it, so a larger maximum leaves a few MiB less in
	// MemTotal. The 512 MiB it was created with would be far outside.
	assert.InDelta(t, resized.memTotal, again.memTotal, 128<<20, "the memory given live before the host died")
}
