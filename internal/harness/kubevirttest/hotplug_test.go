package kubevirttest

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	kubevirtv1 "kubevirt.io/api/core/v1"
)

func claimSource(claim string) *kubevirtv1.HotplugVolumeSource {
	return &kubevirtv1.HotplugVolumeSource{PersistentVolumeClaim: &kubevirtv1.PersistentVolumeClaimVolumeSource{PersistentVolumeClaimVolumeSource: corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}
}

func scsiDisk() *kubevirtv1.Disk {
	return &kubevirtv1.Disk{DiskDevice: kubevirtv1.DiskDevice{Disk: &kubevirtv1.DiskTarget{Bus: kubevirtv1.DiskBusSCSI}}}
}

// TestVirtAPIHotPlugsVolumesOfVMs sends addvolume and removevolume as
// virtctl does and pins what virt-api accepts and refuses.
func TestVirtAPIHotPlugsVolumesOfVMs(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a control plane; skipped with -short")
	}
	c := StartForTest(t, Options{})
	ctx := context.Background()
	vm := testVM("hp")
	vm.Spec.RunStrategy = ptr(kubevirtv1.RunStrategyHalted)
	require.NoError(t, c.Client.Create(ctx, vm))
	rc, err := rest.RESTClientFor(subresourceConfig(c))
	require.NoError(t, err)
	put := func(sub string, opts any) error {
		body, err := json.Marshal(opts)
		require.NoError(t, err)
		if opts == nil {
			body = nil
		}
		return rc.Put().AbsPath("/apis", kubevirtv1.SubresourceGroupName, kubevirtv1.ApiLatestVersion, "namespaces", DefaultNamespace, "virtualmachines", "hp", sub).Body(body).Do(ctx).Error()
	}
	read := func() *kubevirtv1.VirtualMachine {
		got := &kubevirtv1.VirtualMachine{}
		require.NoError(t, c.Client.Get(ctx, types.NamespacedName{Namespace: DefaultNamespace, Name: "hp"}, got))
		return got
	}

	virtio := scsiDisk()
	virtio.Disk.Bus = kubevirtv1.DiskBusVirtio
	cases := []struct {
		name, sub string
		opts      any
		code      int32
		message   string
	}{
		{name: "NoBody", sub: "addvolume", code: http.StatusBadRequest, message: msgNoBody},
		{name: "AddWithoutAName", sub: "addvolume", opts: &kubevirtv1.AddVolumeOptions{Disk: scsiDisk(), VolumeSource: claimSource("x")}, code: http.StatusBadRequest, message: "AddVolumeOptions requires name to be set"},
		{name: "AddWithoutADisk", sub: "addvolume", opts: &kubevirtv1.AddVolumeOptions{Name: "x", VolumeSource: claimSource("x")}, code: http.StatusBadRequest, message: "AddVolumeOptions requires disk to not be nil"},
		{name: "AddWithoutASource", sub: "addvolume", opts: &kubevirtv1.AddVolumeOptions{Name: "x", Disk: scsiDisk()}, code: http.StatusBadRequest, message: "AddVolumeOptions requires VolumeSource to not be nil"},
		{name: "AddOnAVirtioBus", sub: "addvolume", opts: &kubevirtv1.AddVolumeOptions{Name: "x", Disk: virtio, VolumeSource: claimSource("x")}, code: http.StatusUnprocessableEntity, message: `hotplugged Disk x does not use a "scsi" bus`},
		{name: "AddATakenName", sub: "addvolume", opts: &kubevirtv1.AddVolumeOptions{Name: "root", Disk: scsiDisk(), VolumeSource: claimSource("x")}, code: http.StatusConflict, message: "Unable to add volume [root] because volume with that name already exists"},
		{name: "AddAnAttachedClaim", sub: "addvolume", opts: &kubevirtv1.AddVolumeOptions{Name: "x", Disk: scsiDisk(), VolumeSource: claimSource("hp-root")}, code: http.StatusConflict, message: "Unable to add volume source [hp-root] because it already exists"},
		{name: "RemoveWithoutAName", sub: "removevolume", opts: &kubevirtv1.RemoveVolumeOptions{}, code: http.StatusBadRequest, message: "RemoveVolumeOptions requires name to be set"},
		{name: "RemoveAVolumeNotThere", sub: "removevolume", opts: &kubevirtv1.RemoveVolumeOptions{Name: "x"}, code: http.StatusConflict, message: "Unable to remove volume [x] because it does not exist"},
		{name: "RemoveAVolumeNotHotpluggable", sub: "removevolume", opts: &kubevirtv1.RemoveVolumeOptions{Name: "root"}, code: http.StatusConflict, message: "Unable to remove volume [root] because it is not hotpluggable"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := put(tc.sub, tc.opts)
			var status kerrors.APIStatus
			require.ErrorAs(t, err, &status)
			assert.Equal(t, tc.code, status.Status().Code)
			assert.Contains(t, status.Status().Message, tc.message)
			assert.Empty(t, read().Status.VolumeRequests, "nothing recorded")
		})
	}

	t.Run("ADryRunRecordsNothing", func(t *testing.T) {
		require.NoError(t, put("addvolume", &kubevirtv1.AddVolumeOptions{Name: "data", Disk: scsiDisk(), VolumeSource: claimSource("hp-data"), DryRun: []string{metav1.DryRunAll}}))
		assert.Empty(t, read().Status.VolumeRequests)
		assert.Len(t, read().Spec.Template.Spec.Volumes, 2)
	})

	t.Run("AnAddedVolumeJoinsTheTemplateHotpluggable", func(t *testing.T) {
		require.NoError(t, put("addvolume", &kubevirtv1.AddVolumeOptions{Name: "data", Disk: scsiDisk(), VolumeSource: claimSource("hp-data")}))
		var got *kubevirtv1.VirtualMachine
		require.Eventually(t, func() bool {
			got = read()
			return len(got.Status.VolumeRequests) == 0 && len(got.Spec.Template.Spec.Volumes) == 3
		}, 10*time.Second, 20*time.Millisecond)
		v := got.Spec.Template.Spec.Volumes[2]
		assert.Equal(t, "data", v.Name)
		require.NotNil(t, v.PersistentVolumeClaim)
		assert.True(t, v.PersistentVolumeClaim.Hotpluggable, "virt-api makes it hotpluggable")
		assert.Equal(t, "data", got.Spec.Template.Spec.Domain.Devices.Disks[2].Name, "the disk takes the volume's name")
	})

	t.Run("ItsRemovalTakesItOut", func(t *testing.T) {
		require.NoError(t, put("removevolume", &kubevirtv1.RemoveVolumeOptions{Name: "data"}))
		require.Eventually(t, func() bool {
			got := read()
			return len(got.Status.VolumeRequests) == 0 && len(got.Spec.Template.Spec.Volumes) == 2 && len(got.Spec.Template.Spec.Domain.Devices.Disks) == 2
		}, 10*time.Second, 20*time.Millisecond)
	})
}
