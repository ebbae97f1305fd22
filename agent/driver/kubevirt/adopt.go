package kubevirt

import (
	"context"

	"github.com/google/uuid"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/agent/driver"
)

// What virtfleet writes on the KubeVirt VMs it releases and takes over.
// LabelUID always names the uid the VM is managed by or, with
// LabelOrphaned, was released from; AnnotationNamespace and AnnotationName
// that VM's namespace and name.
const (
	// LabelOrphaned marks a VM released from its virtfleet VM: it runs on
	// as it is and no uid manages it, until a claim.
	LabelOrphaned = "virtfleet.io/orphaned"
	// AnnotationImported marks a VM taken over that was not made for a VM
	// of the claiming VM's namespace and name: its template, PVCs and name
	// are its own and never rewritten; its power state, restarts and
	// deletion are driven.
	AnnotationImported = "virtfleet.io/imported"
)

var _ driver.Adopter = (*Driver)(nil)

func orphaned(vm *kubevirtv1.VirtualMachine) bool { return vm.Labels[LabelOrphaned] != "" }

func imported(vm *kubevirtv1.VirtualMachine) bool { return vm.Annotations[AnnotationImported] != "" }

// NotOursError is returned, as a NotFound, for a uid whose VM was released
// or now belongs to another VM: Ensure and Observe do not see it, and
// Delete leaves it alone.
type NotOursError struct{ UID, VM, Why string }

func (e *NotOursError) Error() string {
	return "KubeVirt VirtualMachine " + e.VM + " of uid " + e.UID + " " + e.Why
}

// Release implements driver.Adopter: the VM is labelled orphaned, as
// KubeVirt leaves a VMI whose VM was deleted with propagationPolicy Orphan;
// nothing else of it changes, its VMI least of all.
func (d *Driver) Release(ctx context.Context, uid, seal string) error {
	c, err := d.client()
	if err != nil {
		return err
	}
	return d.retry(c, func(r client.Reader) error {
		vm, _, err := d.get(ctx, r, uid)
		if driver.IsNotFound(err) {
			return nil // absent, released, or another's
		}
		if err != nil {
			return err
		}
		next := vm.DeepCopy()
		next.Labels = merged(next.Labels, map[string]string{LabelOrphaned: "true"})
		next.Annotations = merged(next.Annotations, map[string]string{AnnotationSeal: seal})
		return errors.Wrap(patch(ctx, c, vm, next), "cannot mark the KubeVirt VirtualMachine orphaned")
	})
}

// Orphans implements driver.Adopter. It reads the API server, not the
// informers: the agent asks right after a Release, whose orphan label the
// informers may not show yet, and an orphan it missed would have its report
// deleted with its intent until the next resync.
func (d *Driver) Orphans(ctx context.Context) ([]driver.Observation, error) {
	if _, err := d.client(); err != nil {
		return nil, err
	}
	return d.observeAll(ctx, d.live, true)
}

// find reads the VM ref names: the orphan released under ref.Orphan, or
// the VM of the namespace whose name, or failing that whose uid, is
// ref.ExternalName, managed by virtfleet or not. An orphan is looked for
// in the informers first; any other VM only on the API server, as the
// informers hold virtfleet's alone.
func (d *Driver) find(ctx context.Context, r client.Reader, ref driver.Ref) (*kubevirtv1.VirtualMachine, error) {
	if ref.Orphan != "" {
		for _, r := range []client.Reader{r, d.live} {
			vms := &kubevirtv1.VirtualMachineList{}
			if err := r.List(ctx, vms, client.InNamespace(d.namespace), client.MatchingLabels{LabelUID: ref.Orphan, LabelOrphaned: "true"}); err != nil {
				return nil, errors.Wrap(err, "cannot list KubeVirt VirtualMachines")
			}
			if len(vms.Items) > 0 {
				return &vms.Items[0], nil
			}
		}
		return nil, driver.NotFoundf("no orphan %s in namespace %s of the KubeVirt cluster", ref.Orphan, d.namespace)
	}
	name := ref.ExternalName
	if len(validation.IsDNS1123Subdomain(name)) == 0 {
		vm := &kubevirtv1.VirtualMachine{}
		err := d.live.Get(ctx, types.NamespacedName{Namespace: d.namespace, Name: name}, vm)
		if err == nil {
			return vm, nil
		}
		if !kerrors.IsNotFound(err) {
			return nil, errors.Wrapf(err, "cannot get KubeVirt VirtualMachine %s", name)
		}
	}
	if _, err := uuid.Parse(name); err == nil {
		vms := &kubevirtv1.VirtualMachineList{}
		if err := d.live.List(ctx, vms, client.InNamespace(d.namespace)); err != nil {
			return nil, errors.Wrap(err, "cannot list KubeVirt VirtualMachines")
		}
		for i := range vms.Items {
			if string(vms.Items[i].UID) == name {
				return &vms.Items[i], nil
			}
		}
	}
	return nil, driver.NotFoundf("no KubeVirt VirtualMachine %s in namespace %s", name, d.namespace)
}

// Claim implements driver.Adopter: the VM's labels and annotations name m
// as its manager; its spec, name and VMI stay as they are. An orphan
// adopted by a VM of the namespace and name it was released from is driven
// like one the VM made; any other VM is imported (AnnotationImported).
func (d *Driver) Claim(ctx context.Context, m driver.Machine, ref driver.Ref) error {
	if err := validate(m); err != nil {
		return err
	}
	c, err := d.client()
	if err != nil {
		return err
	}
	d.claimMu.Lock()
	defer d.claimMu.Unlock()
	if _, _, err := d.get(ctx, c, m.UID); !driver.IsNotFound(err) {
		return err // nil: claimed before
	}
	return d.retry(c, func(r client.Reader) error {
		vm, err := d.find(ctx, r, ref)
		if err != nil {
			return err
		}
		owner := vm.Labels[LabelUID]
		if owner != "" && !orphaned(vm) {
			return driver.Terminalf("KubeVirt VirtualMachine %s/%s is already managed by VirtualMachine %s/%s (uid %s); a guest has one VirtualMachine",
				vm.Namespace, vm.Name, vm.Annotations[AnnotationNamespace], vm.Annotations[AnnotationName], owner)
		}
		adopt := owner != "" && vm.Annotations[AnnotationNamespace] == m.Namespace && vm.Annotations[AnnotationName] == m.Name
		next := vm.DeepCopy()
		next.Labels = merged(next.Labels, map[string]string{LabelUID: m.UID})
		delete(next.Labels, LabelOrphaned)
		// The nonces the guest is claimed with count as handled.
		next.Annotations = merged(next.Annotations, map[string]string{AnnotationNamespace: m.Namespace, AnnotationName: m.Name, AnnotationRestartNonce: m.RestartNonce})
		if m.ResetNonce != "" {
			next.Annotations[AnnotationResetNonce] = m.ResetNonce
		}
		if !adopt {
			next.Annotations[AnnotationImported] = "true"
		}
		return errors.Wrapf(patch(ctx, c, vm, next), "cannot claim KubeVirt VirtualMachine %s", vm.Name)
	})
}

// ObserveRef implements driver.Adopter.
func (d *Driver) ObserveRef(ctx context.Context, ref driver.Ref) (driver.Observation, error) {
	c, err := d.client()
	if err != nil {
		return driver.Observation{}, err
	}
	vm, err := d.find(ctx, c, ref)
	if err != nil {
		return driver.Observation{}, err
	}
	vmi, err := d.instance(ctx, c, vm)
	if err != nil {
		return driver.Observation{}, err
	}
	return observe(vm, vmi, d.now()), nil
}
