package kubevirt

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/virtfleet/virtfleet/agent/driver"
)

// TestDisksGrowByPVCExpansion walks a running guest's disk, a PVC of a
// storage class that allows expansion, through size changes against the
// real API server, whose admission expands only a bound PVC of such a
// class. The test plays the provisioner and the resizer: it binds the PVC
// and sets its capacity.
func TestDisksGrowByPVCExpansion(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	class := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "expandable-" + e.ns}, Provisioner: "example.com/disks", AllowVolumeExpansion: ptr(true)}
	require.NoError(t, e.kube.Create(ctx, class))
	t.Cleanup(func() { _ = e.kube.Delete(ctx, class) })

	grown := e.machine()
	grown.Disks[0].Pool = class.Name
	fixed := e.machine()
	for _, m := range []driver.Machine{grown, fixed} {
		e.ensureUntil(m, phaseIs(driver.PhaseRunning))
		e.setPVC(m.Disks[0], "1Gi")
	}
	gi := func(n int64) *resource.Quantity { return resource.NewQuantity(n<<30, resource.BinarySI) }

	steps := []struct {
		name     string
		m        *driver.Machine
		size     int64
		capacity string
		request  *resource.Quantity
		message  string
	}{
		{name: "a larger size raises the PVC's request, and the disk grows until its capacity follows", m: &grown, size: 2 << 30, request: gi(2), message: "is growing from 1Gi to 2Gi"},
		{name: "the resizer's capacity ends the growth", m: &grown, size: 2 << 30, capacity: "2Gi", request: gi(2)},
		{name: "a smaller size leaves the request as it is", m: &grown, size: 1 << 30, request: gi(2)},
		{name: "a storage class without expansion: the API server's refusal is the message", m: &fixed, size: 2 << 30, request: gi(1),
			message: "refused to expand PVC"},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			s.m.Disks[0].SizeBytes = s.size
			if s.capacity != "" {
				e.setPVC(s.m.Disks[0], s.capacity)
			}
			o, err := e.d.Ensure(ctx, *s.m)
			require.NoError(t, err, "a disk that cannot grow fails no Ensure")
			t.Logf("message: %q", o.Message)
			assert.Equal(t, driver.PhaseRunning, o.Phase)
			assert.False(t, o.RestartRequired, "a disk's size needs no restart")
			if s.message == "" {
				assert.Empty(t, o.Message)
			} else {
				assert.Contains(t, o.Message, s.message)
			}
			pvc := e.pvc(s.m.Disks[0])
			assert.Zero(t, s.request.Cmp(pvc.Spec.Resources.Requests[corev1.ResourceStorage]), "request %v", pvc.Spec.Resources.Requests)
		})
	}
}

func (e *env) pvc(disk driver.Disk) *corev1.PersistentVolumeClaim {
	e.t.Helper()
	pvc := &corev1.PersistentVolumeClaim{}
	require.NoError(e.t, e.kube.Get(context.Background(), types.NamespacedName{Namespace: e.ns, Name: ObjectName(disk.Name)}, pvc))
	return pvc
}

// setPVC binds disk's PVC with the capacity given, as a provisioner or a
// resizer would.
func (e *env) setPVC(disk driver.Disk, capacity string) {
	e.t.Helper()
	pvc := e.pvc(disk)
	pvc.Status.Phase = corev1.ClaimBound
	pvc.Status.Capacity = corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(capacity)}
	require.NoError(e.t, e.kube.Status().Update(context.Background(), pvc))
}
