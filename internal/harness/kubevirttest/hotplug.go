package kubevirttest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"

	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/util/retry"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
)

// Volume hot-plug as KubeVirt does it with its HotplugVolumes feature gate
// on (the stand-in has it on): virt-api's addvolume and removevolume of a
// VM check the request against the VM's template and its pending requests
// and append it to the VM's status.volumeRequests; virt-controller applies
// the requests to the running VMI's spec and to the VM's template, then
// clears them; virt-handler attaches each hotpluggable volume of the VMI
// (status.volumeStatus: Pending, then Ready with its attachment pod) and
// detaches each that left its spec (Detaching, then gone).

var vmResource = kubevirtv1.Resource("virtualmachine")

// msgNoBody is virt-api's answer to an addvolume or removevolume without a
// body.
const msgNoBody = "Request with no body, a new name is expected as the request body"

// addVolume serves virtualmachines/{name}/addvolume.
func (v *virtAPI) addVolume(w http.ResponseWriter, r *http.Request) {
	opts := &kubevirtv1.AddVolumeOptions{}
	if refused := decodeVolumeOptions(r, opts); refused != nil {
		writeStatus(w, refused)
		return
	}
	switch {
	case opts.Name == "":
		writeStatus(w, kerrors.NewBadRequest("AddVolumeOptions requires name to be set"))
		return
	case opts.Disk == nil:
		writeStatus(w, kerrors.NewBadRequest("AddVolumeOptions requires disk to not be nil"))
		return
	case opts.VolumeSource == nil:
		writeStatus(w, kerrors.NewBadRequest("AddVolumeOptions requires VolumeSource to not be nil"))
		return
	}
	opts.Disk.Name = opts.Name
	switch {
	case opts.VolumeSource.DataVolume != nil:
		opts.VolumeSource.DataVolume.Hotpluggable = true
	case opts.VolumeSource.PersistentVolumeClaim != nil:
		opts.VolumeSource.PersistentVolumeClaim.Hotpluggable = true
	}
	v.volumeRequest(w, r, kubevirtv1.VirtualMachineVolumeRequest{AddVolumeOptions: opts}, opts.DryRun)
}

// removeVolume serves virtualmachines/{name}/removevolume.
func (v *virtAPI) removeVolume(w http.ResponseWriter, r *http.Request) {
	opts := &kubevirtv1.RemoveVolumeOptions{}
	if refused := decodeVolumeOptions(r, opts); refused != nil {
		writeStatus(w, refused)
		return
	}
	if opts.Name == "" {
		writeStatus(w, kerrors.NewBadRequest("RemoveVolumeOptions requires name to be set"))
		return
	}
	v.volumeRequest(w, r, kubevirtv1.VirtualMachineVolumeRequest{RemoveVolumeOptions: opts}, opts.DryRun)
}

func decodeVolumeOptions(r *http.Request, opts any) *kerrors.StatusError {
	if r.ContentLength == 0 {
		return kerrors.NewBadRequest(msgNoBody)
	}
	if err := json.NewDecoder(r.Body).Decode(opts); err != nil && !errors.Is(err, io.EOF) {
		return kerrors.NewBadRequest(fmt.Sprintf("Can not unmarshal Request body to struct, error: %s", err))
	}
	return nil
}

// volumeRequest checks req against the VM's template and pending requests
// as virt-api does (verifyVolumeOption, addAddVolumeRequests,
// addRemoveVolumeRequests), and against what the VM admission webhook
// refuses of a hot-plugged disk, then records it in the VM's
// status.volumeRequests; a dry run records nothing.
func (v *virtAPI) volumeRequest(w http.ResponseWriter, r *http.Request, req kubevirtv1.VirtualMachineVolumeRequest, dryRun []string) {
	nn := types.NamespacedName{Namespace: r.PathValue("namespace"), Name: r.PathValue("name")}
	var refused *kerrors.StatusError
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		vm := &kubevirtv1.VirtualMachine{}
		if err := v.client.Get(r.Context(), nn, vm); err != nil {
			return err
		}
		if vm.Spec.Template == nil {
			refused = kerrors.NewConflict(vmResource, nn.Name, errors.New("VM has no template"))
			return nil
		}
		if msg := verifyVolumeRequest(vm.Spec.Template.Spec.Volumes, req); msg != "" {
			refused = kerrors.NewConflict(vmResource, nn.Name, errors.New(msg))
			return nil
		}
		if refused = invalidHotplugDisk(nn.Name, req); refused != nil {
			return nil
		}
		requests, msg := withVolumeRequest(vm.Status.VolumeRequests, req)
		if msg != "" {
			refused = kerrors.NewConflict(vmResource, nn.Name, errors.New(msg))
			return nil
		}
		if len(dryRun) > 0 {
			return nil
		}
		vm.Status.VolumeRequests = requests
		return v.client.Status().Update(r.Context(), vm)
	})
	var status kerrors.APIStatus
	switch {
	case refused != nil:
		writeStatus(w, refused)
	case errors.As(err, &status):
		writeStatus(w, status)
	case err != nil:
		writeStatus(w, kerrors.NewInternalError(err))
	default:
		w.WriteHeader(http.StatusAccepted)
	}
}

// verifyVolumeRequest is virt-api's verifyVolumeOption: an added volume's
// name and source are new, a removed one exists and is hotpluggable.
func verifyVolumeRequest(volumes []kubevirtv1.Volume, req kubevirtv1.VirtualMachineVolumeRequest) string {
	if add := req.AddVolumeOptions; add != nil {
		source := hotplugSourceName(add.VolumeSource)
		for _, vol := range volumes {
			if vol.Name == add.Name {
				return fmt.Sprintf("Unable to add volume [%s] because volume with that name already exists", add.Name)
			}
			if source != "" && claimName(vol) == source {
				return fmt.Sprintf("Unable to add volume source [%s] because it already exists", source)
			}
		}
		return ""
	}
	name := req.RemoveVolumeOptions.Name
	for _, vol := range volumes {
		if vol.Name == name || claimName(vol) == name {
			if !hotpluggable(vol) {
				return fmt.Sprintf("Unable to remove volume [%s] because it is not hotpluggable", vol.Name)
			}
			return ""
		}
	}
	return fmt.Sprintf("Unable to remove volume [%s] because it does not exist", name)
}

// invalidHotplugDisk is the VM admission webhook's refusal of a disk
// hot-plugged with a bus the hot-plug cannot use: SCSI only.
func invalidHotplugDisk(name string, req kubevirtv1.VirtualMachineVolumeRequest) *kerrors.StatusError {
	add := req.AddVolumeOptions
	if add == nil {
		return nil
	}
	d := add.Disk
	var msg string
	switch {
	case d.Disk == nil && d.LUN == nil && d.CDRom == nil:
		msg = fmt.Sprintf("Disk %s requires diskDevice of type 'disk','lun' or cdrom to be hotplugged.", d.Name)
	case (d.Disk != nil && d.Disk.Bus != kubevirtv1.DiskBusSCSI) || (d.LUN != nil && d.LUN.Bus != kubevirtv1.DiskBusSCSI) || (d.CDRom != nil && d.CDRom.Bus != kubevirtv1.DiskBusSCSI):
		msg = fmt.Sprintf("hotplugged Disk %s does not use a %q bus", d.Name, kubevirtv1.DiskBusSCSI)
	default:
		return nil
	}
	return kerrors.NewInvalid(kubevirtv1.VirtualMachineGroupVersionKind.GroupKind(), name, field.ErrorList{field.Invalid(field.NewPath("status", "volumeRequests"), d.Name, msg)})
}

// withVolumeRequest is requests with req added, as virt-api adds it: a
// second add or remove of one name is refused, and a remove drops the add
// of its name still pending.
func withVolumeRequest(requests []kubevirtv1.VirtualMachineVolumeRequest, req kubevirtv1.VirtualMachineVolumeRequest) ([]kubevirtv1.VirtualMachineVolumeRequest, string) {
	out := make([]kubevirtv1.VirtualMachineVolumeRequest, 0, len(requests)+1)
	for _, pending := range requests {
		switch {
		case req.AddVolumeOptions != nil && pending.AddVolumeOptions != nil && pending.AddVolumeOptions.Name == req.AddVolumeOptions.Name:
			return nil, fmt.Sprintf("add volume request for volume [%s] already exists", req.AddVolumeOptions.Name)
		case req.AddVolumeOptions != nil && pending.RemoveVolumeOptions != nil && pending.RemoveVolumeOptions.Name == req.AddVolumeOptions.Name:
			return nil, fmt.Sprintf("unable to add volume since a remove volume request for volume [%s] already exists and is still being processed", req.AddVolumeOptions.Name)
		case req.RemoveVolumeOptions != nil && pending.RemoveVolumeOptions != nil && pending.RemoveVolumeOptions.Name == req.RemoveVolumeOptions.Name:
			return nil, fmt.Sprintf("a remove volume request for volume [%s] already exists and is still being processed", req.RemoveVolumeOptions.Name)
		case req.RemoveVolumeOptions != nil && pending.AddVolumeOptions != nil && pending.AddVolumeOptions.Name == req.RemoveVolumeOptions.Name:
			continue
		}
		out = append(out, pending)
	}
	return append(out, req), ""
}

func hotplugSourceName(s *kubevirtv1.HotplugVolumeSource) string {
	switch {
	case s.DataVolume != nil:
		return s.DataVolume.Name
	case s.PersistentVolumeClaim != nil:
		return s.PersistentVolumeClaim.ClaimName
	}
	return ""
}

func hotpluggable(v kubevirtv1.Volume) bool {
	return (v.DataVolume != nil && v.DataVolume.Hotpluggable) || (v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.Hotpluggable)
}

// applyVolumeRequest is KubeVirt's ApplyVolumeRequestOnVMISpec: an add
// appends the disk and volume (once), a remove drops both.
func applyVolumeRequest(spec *kubevirtv1.VirtualMachineInstanceSpec, req kubevirtv1.VirtualMachineVolumeRequest) {
	if add := req.AddVolumeOptions; add != nil {
		if slices.ContainsFunc(spec.Volumes, func(v kubevirtv1.Volume) bool { return v.Name == add.Name }) {
			return
		}
		source := kubevirtv1.VolumeSource{}
		switch {
		case add.VolumeSource.DataVolume != nil:
			source.DataVolume = add.VolumeSource.DataVolume.DeepCopy()
		case add.VolumeSource.PersistentVolumeClaim != nil:
			source.PersistentVolumeClaim = add.VolumeSource.PersistentVolumeClaim.DeepCopy()
		}
		spec.Volumes = append(spec.Volumes, kubevirtv1.Volume{Name: add.Name, VolumeSource: source})
		disk := add.Disk.DeepCopy()
		disk.Name = add.Name
		spec.Domain.Devices.Disks = append(spec.Domain.Devices.Disks, *disk)
		return
	}
	name := req.RemoveVolumeOptions.Name
	var removed []string
	spec.Volumes = slices.DeleteFunc(spec.Volumes, func(v kubevirtv1.Volume) bool {
		if v.Name == name || claimName(v) == name {
			removed = append(removed, v.Name)
			return true
		}
		return false
	})
	spec.Domain.Devices.Disks = slices.DeleteFunc(spec.Domain.Devices.Disks, func(d kubevirtv1.Disk) bool { return slices.Contains(removed, d.Name) })
}

// volumeRequests is virt-controller's handling of a VM's volume requests:
// applied to the VMI while it runs, then to the template, then cleared.
func (c *FakeVirtController) volumeRequests(ctx context.Context, vm *kubevirtv1.VirtualMachine, vmi *kubevirtv1.VirtualMachineInstance) error {
	if vmi != nil && vmi.DeletionTimestamp == nil && !vmi.IsFinal() {
		for _, req := range vm.Status.VolumeRequests {
			applyVolumeRequest(&vmi.Spec, req)
		}
		if err := c.client.Update(ctx, vmi); err != nil {
			return errors.Wrap(err, "cannot hot-plug the VMI's volumes")
		}
	}
	requests := vm.Status.VolumeRequests
	for _, req := range requests {
		applyVolumeRequest(&vm.Spec.Template.Spec, req)
	}
	if err := c.client.Update(ctx, vm); err != nil {
		return errors.Wrap(err, "cannot apply the volume requests to the VM's template")
	}
	// Only the requests applied: virt-api may have added one meanwhile,
	// and then this update conflicts and the reconcile comes back.
	vm.Status.VolumeRequests = slices.DeleteFunc(vm.Status.VolumeRequests, func(r kubevirtv1.VirtualMachineVolumeRequest) bool {
		return slices.ContainsFunc(requests, func(applied kubevirtv1.VirtualMachineVolumeRequest) bool { return equalRequest(r, applied) })
	})
	return errors.Wrap(c.client.Status().Update(ctx, vm), "cannot clear the VM's volume requests")
}

func equalRequest(a, b kubevirtv1.VirtualMachineVolumeRequest) bool {
	switch {
	case a.AddVolumeOptions != nil && b.AddVolumeOptions != nil:
		return a.AddVolumeOptions.Name == b.AddVolumeOptions.Name
	case a.RemoveVolumeOptions != nil && b.RemoveVolumeOptions != nil:
		return a.RemoveVolumeOptions.Name == b.RemoveVolumeOptions.Name
	}
	return false
}

// volumeStatus is the VMI's status.volumeStatus one step on, as
// virt-handler keeps it: a volume of its spec is Ready (a hotpluggable
// one after a step Pending, with its attachment pod), one that left its
// spec is Detaching for a step, then gone. changed says whether it moved.
func volumeStatus(vmi *kubevirtv1.VirtualMachineInstance, atStart bool) ([]kubevirtv1.VolumeStatus, bool) {
	var out []kubevirtv1.VolumeStatus
	changed := false
	for _, vol := range vmi.Spec.Volumes {
		old := findVolumeStatus(vmi.Status.VolumeStatus, vol.Name)
		s := kubevirtv1.VolumeStatus{Name: vol.Name, Target: target(vmi, vol.Name), Phase: kubevirtv1.VolumeReady, Reason: "VolumeReady"}
		if claim := claimName(vol); claim != "" {
			s.PersistentVolumeClaimInfo = &kubevirtv1.PersistentVolumeClaimInfo{ClaimName: claim}
		}
		if hotpluggable(vol) {
			s.HotplugVolume = &kubevirtv1.HotplugVolumeStatus{AttachPodName: "hp-volume-" + vmi.Name}
			s.Message = fmt.Sprintf("Successfully attach hotplugged volume %s to VM", vol.Name)
			if old == nil && !atStart {
				s.Phase, s.Reason, s.Message, s.Target = kubevirtv1.VolumePending, "", "", ""
			}
		}
		if old == nil || old.Phase != s.Phase {
			changed = true
		}
		out = append(out, s)
	}
	for _, old := range vmi.Status.VolumeStatus {
		if slices.ContainsFunc(vmi.Spec.Volumes, func(v kubevirtv1.Volume) bool { return v.Name == old.Name }) {
			continue
		}
		changed = true
		if old.Phase != kubevirtv1.HotplugVolumeDetaching {
			old.Phase, old.Reason, old.Message = kubevirtv1.HotplugVolumeDetaching, "", ""
			out = append(out, old)
		}
	}
	return out, changed
}

func findVolumeStatus(all []kubevirtv1.VolumeStatus, name string) *kubevirtv1.VolumeStatus {
	for i := range all {
		if all[i].Name == name {
			return &all[i]
		}
	}
	return nil
}

// target is the guest device of the VMI's disk named name, as libvirt
// names it: vd<letter> for virtio, sd<letter> for SCSI and SATA, by order.
func target(vmi *kubevirtv1.VirtualMachineInstance, name string) string {
	counts := map[string]int{}
	for _, d := range vmi.Spec.Domain.Devices.Disks {
		prefix := "sd"
		if d.Disk != nil && d.Disk.Bus == kubevirtv1.DiskBusVirtio {
			prefix = "vd"
		}
		if d.Name == name {
			return prefix + string(rune('a'+counts[prefix]))
		}
		counts[prefix]++
	}
	return ""
}
