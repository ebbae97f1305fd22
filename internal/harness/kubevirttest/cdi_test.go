package kubevirttest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	kubevirtv1 "kubevirt.io/api/core/v1"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
)

// heldServer serves body with its length at every path; the first half at
// once, the second once release is closed.
func heldServer(t *testing.T, body []byte, release <-chan struct{}) *httptest.Server {
	t.Helper()
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/missing" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		_, _ = w.Write(body[:len(body)/2])
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		_, _ = w.Write(body[len(body)/2:])
	}))
	t.Cleanup(s.Close)
	return s
}

func httpDataVolume(name, url string) *cdiv1.DataVolume {
	return &cdiv1.DataVolume{
		ObjectMeta: metav1.ObjectMeta{Namespace: DefaultNamespace, Name: name, Labels: map[string]string{"owner": "test"}, Annotations: map[string]string{"note": "kept"}},
		Spec: cdiv1.DataVolumeSpec{
			Source:  &cdiv1.DataVolumeSource{HTTP: &cdiv1.DataVolumeSourceHTTP{URL: url}},
			Storage: &cdiv1.StorageSpec{Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}},
		},
	}
}

func dataVolumeCondition(dv *cdiv1.DataVolume, t cdiv1.DataVolumeConditionType) cdiv1.DataVolumeCondition {
	if c := findDataVolumeCondition(dv, t); c != nil {
		return *c
	}
	return cdiv1.DataVolumeCondition{}
}

// TestFakeCDI starts one cluster and walks DataVolumes, and VMs using
// them, through what CDI and KubeVirt would do with them.
func TestFakeCDI(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a control plane; skipped with -short")
	}
	c := StartForTest(t, Options{})
	ctx := context.Background()
	kube := c.Client
	body := make([]byte, 256<<10)
	for i := range body {
		body[i] = byte(i * 31)
	}
	sum := sha256.Sum256(body)
	release := make(chan struct{})
	srv := heldServer(t, body, release)
	get := func(name string) *cdiv1.DataVolume {
		dv := &cdiv1.DataVolume{}
		require.NoError(t, kube.Get(ctx, types.NamespacedName{Namespace: DefaultNamespace, Name: name}, dv))
		return dv
	}
	printable := func(name string) kubevirtv1.VirtualMachinePrintableStatus {
		vm := &kubevirtv1.VirtualMachine{}
		require.NoError(t, kube.Get(ctx, types.NamespacedName{Namespace: DefaultNamespace, Name: name}, vm))
		return vm.Status.PrintableStatus
	}
	vmi := func(name string) *kubevirtv1.VirtualMachineInstance {
		v := &kubevirtv1.VirtualMachineInstance{}
		if err := kube.Get(ctx, types.NamespacedName{Namespace: DefaultNamespace, Name: name}, v); kerrors.IsNotFound(err) {
			return nil
		}
		return v
	}

	// A VM whose root disk is the DataVolume "vm1-root", as a user names
	// one they made (no dataVolumeTemplate).
	vm := testVM("vm1")
	vm.Spec.Template.Spec.Volumes[0].VolumeSource = kubevirtv1.VolumeSource{DataVolume: &kubevirtv1.DataVolumeSource{Name: "vm1-root"}}
	require.NoError(t, kube.Create(ctx, httpDataVolume("vm1-root", srv.URL+"/disk.img")))
	require.NoError(t, kube.Create(ctx, vm))

	t.Run("ImportInProgressReportsProgressAndHoldsTheVMI", func(t *testing.T) {
		var dv *cdiv1.DataVolume
		require.Eventually(t, func() bool {
			dv = get("vm1-root")
			return dv.Status.Phase == cdiv1.ImportInProgress && dv.Status.Progress == "50.00%"
		}, 10*time.Second, 20*time.Millisecond, "half of the image arrived")
		assert.Equal(t, "vm1-root", dv.Status.ClaimName)
		assert.Equal(t, corev1.ConditionTrue, dataVolumeCondition(dv, cdiv1.DataVolumeBound).Status)
		assert.Equal(t, corev1.ConditionTrue, dataVolumeCondition(dv, cdiv1.DataVolumeRunning).Status)
		ready := dataVolumeCondition(dv, cdiv1.DataVolumeReady)
		assert.Equal(t, corev1.ConditionFalse, ready.Status)
		assert.Equal(t, "TransferRunning", ready.Reason)

		pvc := &corev1.PersistentVolumeClaim{}
		require.NoError(t, kube.Get(ctx, types.NamespacedName{Namespace: DefaultNamespace, Name: "vm1-root"}, pvc))
		assert.True(t, metav1.IsControlledBy(pvc, dv), "CDI's PVC is the DataVolume's")
		assert.Equal(t, map[string]string{LabelCDIKey: LabelCDIValue, "owner": "test"}, pvc.Labels, "with the DataVolume's labels")
		assert.Equal(t, "kept", pvc.Annotations["note"], "and annotations")
		assert.Equal(t, string(dv.UID), pvc.Annotations[AnnCreatedForDataVolume])
		assert.Equal(t, corev1.ClaimBound, pvc.Status.Phase)
		assert.Equal(t, []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, pvc.Spec.AccessModes, "the storage profile's access mode")
		assert.Equal(t, "1Gi", pvc.Spec.Resources.Requests.Storage().String())

		require.Eventually(t, func() bool { return printable("vm1") == kubevirtv1.VirtualMachineStatusProvisioning }, 5*time.Second, 20*time.Millisecond)
		v := vmi("vm1")
		require.NotNil(t, v, "KubeVirt makes the VMI of a VM whose DataVolume is not ready")
		assert.Equal(t, kubevirtv1.Pending, v.Status.Phase, "and holds it Pending")
		assert.Empty(t, v.Status.NodeName)
		_, ok := c.CDI.Imported(types.NamespacedName{Namespace: DefaultNamespace, Name: "vm1-root"})
		assert.False(t, ok, "nothing imported yet")
	})

	t.Run("SucceededImportRunsTheVM", func(t *testing.T) {
		close(release)
		require.Eventually(t, func() bool {
			v := vmi("vm1")
			return v != nil && v.Status.Phase == kubevirtv1.Running
		}, 10*time.Second, 20*time.Millisecond)
		dv := get("vm1-root")
		assert.Equal(t, cdiv1.Succeeded, dv.Status.Phase)
		assert.Equal(t, cdiv1.DataVolumeProgress("100.0%"), dv.Status.Progress)
		assert.Equal(t, corev1.ConditionTrue, dataVolumeCondition(dv, cdiv1.DataVolumeReady).Status)
		running := dataVolumeCondition(dv, cdiv1.DataVolumeRunning)
		assert.Equal(t, corev1.ConditionFalse, running.Status)
		assert.Equal(t, ReasonCompleted, running.Reason)
		imported, ok := c.CDI.Imported(types.NamespacedName{Namespace: DefaultNamespace, Name: "vm1-root"})
		require.True(t, ok)
		assert.Equal(t, Import{DataVolume: dv.UID, URL: srv.URL + "/disk.img", SHA256: hex.EncodeToString(sum[:]), Size: int64(len(body))}, imported)
		require.Eventually(t, func() bool { return printable("vm1") == kubevirtv1.VirtualMachineStatusRunning }, 5*time.Second, 20*time.Millisecond)
	})

	t.Run("AnHTTPErrorRestartsTheImporter", func(t *testing.T) {
		vm := testVM("vm2")
		vm.Spec.Template.Spec.Volumes[0].VolumeSource = kubevirtv1.VolumeSource{DataVolume: &kubevirtv1.DataVolumeSource{Name: "vm2-root"}}
		require.NoError(t, kube.Create(ctx, httpDataVolume("vm2-root", srv.URL+"/missing")))
		require.NoError(t, kube.Create(ctx, vm))
		var dv *cdiv1.DataVolume
		require.Eventually(t, func() bool {
			dv = get("vm2-root")
			return dv.Status.RestartCount >= 2
		}, 10*time.Second, 20*time.Millisecond, "the importer is restarted")
		assert.Equal(t, cdiv1.ImportInProgress, dv.Status.Phase, "the pod runs on; its container restarts")
		running := dataVolumeCondition(dv, cdiv1.DataVolumeRunning)
		assert.Equal(t, corev1.ConditionFalse, running.Status)
		assert.Equal(t, ReasonError, running.Reason)
		assert.Equal(t, "Unable to connect to http data source: expected status code 200, got 404. Status: 404 Not Found", running.Message)
		require.Eventually(t, func() bool { return printable("vm2") == kubevirtv1.VirtualMachineStatusDataVolumeError }, 5*time.Second, 20*time.Millisecond)
		assert.Equal(t, kubevirtv1.Pending, vmi("vm2").Status.Phase)
	})

	t.Run("AHaltedVMShowsItsDataVolumesProvisioning", func(t *testing.T) {
		held := make(chan struct{})
		defer close(held)
		slow := heldServer(t, body, held)
		vm := testVM("vm3")
		vm.Spec.RunStrategy = ptr(kubevirtv1.RunStrategyHalted)
		vm.Spec.Template.Spec.Volumes[0].VolumeSource = kubevirtv1.VolumeSource{DataVolume: &kubevirtv1.DataVolumeSource{Name: "vm3-root"}}
		require.NoError(t, kube.Create(ctx, httpDataVolume("vm3-root", slow.URL+"/disk.img")))
		require.NoError(t, kube.Create(ctx, vm))
		require.Eventually(t, func() bool { return printable("vm3") == kubevirtv1.VirtualMachineStatusProvisioning }, 10*time.Second, 20*time.Millisecond)
		assert.Nil(t, vmi("vm3"))
	})

	t.Run("ThePVCOfADeletedDataVolumeIsCollected", func(t *testing.T) {
		require.NoError(t, kube.Delete(ctx, &kubevirtv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: DefaultNamespace, Name: "vm2"}}))
		require.NoError(t, kube.Delete(ctx, get("vm2-root")))
		require.Eventually(t, func() bool {
			// The API server's pvc-protection finalizer holds a deleted
			// PVC, and no controller here lifts it.
			pvc := &corev1.PersistentVolumeClaim{}
			err := kube.Get(ctx, types.NamespacedName{Namespace: DefaultNamespace, Name: "vm2-root"}, pvc)
			return kerrors.IsNotFound(err) || (err == nil && pvc.DeletionTimestamp != nil)
		}, 10*time.Second, 20*time.Millisecond, "as the garbage collector deletes what the DataVolume owned")
	})
}
