package kubevirttest

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"
)

// HandMadeVM is a VirtualMachine as a KubeVirt user writes one, nothing of
// virtfleet's in it: runStrategy Always, one vCPU, 128 MiB, a containerDisk
// to boot from, and one bridged interface on the Multus network network
// (a NetworkAttachmentDefinition's name) as its default network.
func HandMadeVM(namespace, name, network string) *kubevirtv1.VirtualMachine {
	memory := resource.MustParse("128Mi")
	labels := map[string]string{"app": name}
	return &kubevirtv1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, Labels: labels},
		Spec: kubevirtv1.VirtualMachineSpec{
			RunStrategy: ptr(kubevirtv1.RunStrategyAlways),
			Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: kubevirtv1.VirtualMachineInstanceSpec{
					Domain: kubevirtv1.DomainSpec{
						CPU:       &kubevirtv1.CPU{Cores: 1},
						Resources: kubevirtv1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceMemory: memory}},
						Devices: kubevirtv1.Devices{
							Disks:      []kubevirtv1.Disk{{Name: "root", DiskDevice: kubevirtv1.DiskDevice{Disk: &kubevirtv1.DiskTarget{Bus: kubevirtv1.DiskBusVirtio}}}},
							Interfaces: []kubevirtv1.Interface{{Name: "default", InterfaceBindingMethod: kubevirtv1.InterfaceBindingMethod{Bridge: &kubevirtv1.InterfaceBridge{}}}},
						},
					},
					Networks: []kubevirtv1.Network{{Name: "default", NetworkSource: kubevirtv1.NetworkSource{Multus: &kubevirtv1.MultusNetwork{NetworkName: network, Default: true}}}},
					Volumes: []kubevirtv1.Volume{{Name: "root", VolumeSource: kubevirtv1.VolumeSource{
						ContainerDisk: &kubevirtv1.ContainerDiskSource{Image: "quay.io/containerdisks/fedora:latest"},
					}}},
				},
			},
		},
	}
}
