package kubevirt

import (
	"context"
	"slices"
	"strings"

	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtfleet/virtfleet/agent/driver"
)

// hotplug attaches the data disks m adds to the running guest of vm and
// detaches those it drops, as virtctl addvolume and removevolume do:
// through the VM's addvolume and removevolume subresources, which
// KubeVirt applies to the running VMI and to the VM's template alike, so
// a disk stays attached (or detached) across restarts. Requests still
// pending in the VM's status count as made. A disk whose image is still
// being checked waits; the progress of that check is returned.
func (d *Driver) hotplug(ctx context.Context, c client.Client, m driver.Machine, vm, want *kubevirtv1.VirtualMachine) (string, error) {
	have := map[string]kubevirtv1.Volume{}
	for _, v := range dataVolumes(vm.Spec.Template) {
		have[claimOf(v)] = v
	}
	for _, r := range vm.Status.VolumeRequests {
		switch {
		case r.AddVolumeOptions != nil && r.AddVolumeOptions.VolumeSource != nil:
			src := r.AddVolumeOptions.VolumeSource
			v := kubevirtv1.Volume{Name: r.AddVolumeOptions.Name, VolumeSource: kubevirtv1.VolumeSource{PersistentVolumeClaim: src.PersistentVolumeClaim, DataVolume: src.DataVolume}}
			have[claimOf(v)] = v
		case r.RemoveVolumeOptions != nil:
			for claim, v := range have {
				if v.Name == r.RemoveVolumeOptions.Name || claim == r.RemoveVolumeOptions.Name {
					delete(have, claim)
				}
			}
		}
	}
	wanted := dataVolumes(want.Spec.Template)
	var adding []kubevirtv1.Volume
	for _, v := range wanted {
		if _, ok := have[claimOf(v)]; !ok {
			adding = append(adding, v)
		}
	}
	var progress string
	if len(adding) > 0 {
		var err error
		if progress, err = d.ensureVolumes(ctx, c, m); err != nil {
			return "", err
		}
		if progress != "" {
			adding = nil
		}
	}
	for _, v := range adding {
		i := slices.IndexFunc(want.Spec.Template.Spec.Domain.Devices.Disks, func(d kubevirtv1.Disk) bool { return d.Name == v.Name })
		opts := &kubevirtv1.AddVolumeOptions{
			Name: v.Name, Disk: &want.Spec.Template.Spec.Domain.Devices.Disks[i],
			VolumeSource: &kubevirtv1.HotplugVolumeSource{PersistentVolumeClaim: v.PersistentVolumeClaim, DataVolume: v.DataVolume},
		}
		if err := d.put(ctx, "virtualmachines", "VM", vm.Namespace, vm.Name, "addvolume", opts); err != nil {
			return "", err
		}
	}
	for claim, v := range have {
		// One that is not hotpluggable (made before the driver hot-plugged
		// disks) was dropped from the template instead: KubeVirt detaches
		// it at the next start.
		if !hotpluggable(v) || slices.ContainsFunc(wanted, func(w kubevirtv1.Volume) bool { return claimOf(w) == claim }) {
			continue
		}
		if err := d.put(ctx, "virtualmachines", "VM", vm.Namespace, vm.Name, "removevolume", &kubevirtv1.RemoveVolumeOptions{Name: v.Name}); err != nil {
			return "", err
		}
	}
	return progress, nil
}

// dropUnpluggable drops from the template next the data disks that are not
// hotpluggable and that want no longer has: KubeVirt cannot detach them
// live, so they go at the next start.
func dropUnpluggable(next, want *kubevirtv1.VirtualMachineInstanceTemplateSpec) {
	if next == nil || want == nil {
		return
	}
	keep := dataClaims(want)
	var dropped []string
	next.Spec.Volumes = slices.DeleteFunc(next.Spec.Volumes, func(v kubevirtv1.Volume) bool {
		drop := isData(v) && !hotpluggable(v) && !slices.Contains(keep, claimOf(v))
		if drop {
			dropped = append(dropped, v.Name)
		}
		return drop
	})
	next.Spec.Domain.Devices.Disks = slices.DeleteFunc(next.Spec.Domain.Devices.Disks, func(d kubevirtv1.Disk) bool { return slices.Contains(dropped, d.Name) })
}

// isData is whether v is a data disk's volume: a claim's, not the boot
// disk's.
func isData(v kubevirtv1.Volume) bool {
	return v.Name != diskName(0) && claimOf(v) != ""
}

// dataVolumes are the template's data disks' volumes, in order.
func dataVolumes(t *kubevirtv1.VirtualMachineInstanceTemplateSpec) []kubevirtv1.Volume {
	if t == nil {
		return nil
	}
	var out []kubevirtv1.Volume
	for _, v := range t.Spec.Volumes {
		if isData(v) {
			out = append(out, v)
		}
	}
	return out
}

// dataClaims are the claims of the template's data disks, in order.
func dataClaims(t *kubevirtv1.VirtualMachineInstanceTemplateSpec) []string {
	return claimsOf(dataVolumes(t))
}

// claimOf is the PVC or DataVolume a volume is; empty for another kind.
func claimOf(v kubevirtv1.Volume) string {
	return strings.Join(claimsOf([]kubevirtv1.Volume{v}), "")
}

func hotpluggable(v kubevirtv1.Volume) bool {
	return (v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.Hotpluggable) || (v.DataVolume != nil && v.DataVolume.Hotpluggable)
}
