package kubevirt

import (
	"testing"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"
)

// A running VMI keeps the volumes it started with; the note names those
// its VM's template adds or drops, which wait for the next start.
func TestVolumeNote(t *testing.T) {
	pvc := func(name string) kubevirtv1.Volume {
		return kubevirtv1.Volume{Name: name, VolumeSource: kubevirtv1.VolumeSource{PersistentVolumeClaim: &kubevirtv1.PersistentVolumeClaimVolumeSource{
			PersistentVolumeClaimVolumeSource: corev1.PersistentVolumeClaimVolumeSource{ClaimName: "claim-" + name},
		}}}
	}
	dv := func(name string) kubevirtv1.Volume {
		return kubevirtv1.Volume{Name: name, VolumeSource: kubevirtv1.VolumeSource{DataVolume: &kubevirtv1.DataVolumeSource{Name: "dv-" + name}}}
	}
	cloudInit := kubevirtv1.Volume{Name: cloudInitName, VolumeSource: kubevirtv1.VolumeSource{CloudInitNoCloud: &kubevirtv1.CloudInitNoCloudSource{}}}
	cases := map[string]struct {
		template, running []kubevirtv1.Volume
		want              string
	}{
		"TheSameVolumesAreNothingToSay":  {template: []kubevirtv1.Volume{dv("disk0"), pvc("disk1"), cloudInit}, running: []kubevirtv1.Volume{dv("disk0"), pvc("disk1"), cloudInit}},
		"AnAddedVolumeWaitsForTheStart":  {template: []kubevirtv1.Volume{dv("disk0"), pvc("disk1"), cloudInit}, running: []kubevirtv1.Volume{dv("disk0"), cloudInit}, want: "volume claim-disk1 is attached at the next start"},
		"ARemovedVolumeWaitsForTheStart": {template: []kubevirtv1.Volume{dv("disk0"), cloudInit}, running: []kubevirtv1.Volume{dv("disk0"), pvc("disk1"), cloudInit}, want: "volume claim-disk1 is detached at the next start"},
		"BothAreNamed":                   {template: []kubevirtv1.Volume{dv("disk0"), pvc("disk2")}, running: []kubevirtv1.Volume{dv("disk0"), pvc("disk1")}, want: "volume claim-disk2 is attached at the next start; volume claim-disk1 is detached at the next start"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			vm := &kubevirtv1.VirtualMachine{Spec: kubevirtv1.VirtualMachineSpec{Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{Spec: kubevirtv1.VirtualMachineInstanceSpec{Volumes: tc.template}}}}
			vmi := &kubevirtv1.VirtualMachineInstance{Spec: kubevirtv1.VirtualMachineInstanceSpec{Volumes: tc.running}}
			assert.Equal(t, tc.want, volumeNote(vm, vmi))
		})
	}
}
