package plugin

import (
	"cmp"
	"context"
	"fmt"
	"time"

	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	v1alpha1 "github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
)

// The kinds a restore from a backup reads and makes.
var (
	diskImages = v1alpha1.SchemeGroupVersion.WithResource("diskimages")
	volumes    = v1alpha1.SchemeGroupVersion.WithResource("volumes")
)

// fromBackup is a VM made again from one of its backups: a DiskImage of
// each of the backup's disks, a Volume of each image, as large as the
// backed-up VM's, and a VM with the backed-up VM's spec on them, named
// name. The VM the backup holds must still exist: its spec and its
// Volumes' sizes are read from it (the backup keeps them too, in its
// location, which the user's credentials do not reach).
type fromBackup struct {
	dc        dynamic.Interface
	namespace string
	name      string
}

// plan reads backup and its VM and returns what to create, in order.
func (f fromBackup) plan(ctx context.Context, backup string) ([]runtime.Object, error) {
	b := &v1alpha1.VirtualMachineBackup{}
	if err := f.get(ctx, backups, backup, b); err != nil {
		return nil, err
	}
	if b.Status.Phase != v1alpha1.BackupSucceeded {
		return nil, fmt.Errorf("VirtualMachineBackup %s/%s is %s, not Succeeded: only a whole backup is restored", f.namespace, backup, cmp.Or(string(b.Status.Phase), "Pending"))
	}
	src := &v1alpha1.VirtualMachine{}
	switch err := f.get(ctx, vms, string(b.Spec.VMName), src); {
	case kerrors.IsNotFound(err):
		return nil, fmt.Errorf("VirtualMachine %s/%s, which backup %s holds, is gone, and with it the spec and Volume sizes to restore it with: make a DiskImage with source.backup {location: %s, id: %s}, a Volume and a VM yourself (README, Backups)", f.namespace, b.Spec.VMName, backup, b.Spec.Location, b.UID)
	case err != nil:
		return nil, err
	}
	fp := *src.Spec.ForProvider.DeepCopy()
	// The copy gets its own addresses: the source's may still be in use.
	fp.Addresses = nil
	var out []runtime.Object
	format := v1alpha1.DiskFormatRaw
	for i, a := range src.Spec.ForProvider.DiskAttachments {
		disk := v1alpha1.BackupDiskName(i, a.Name)
		vol := &v1alpha1.Volume{}
		if err := f.get(ctx, volumes, string(a.Name), vol); err != nil {
			return nil, fmt.Errorf("cannot read the size of the backed-up VM's Volume %s: %w", a.Name, err)
		}
		name := f.name + "-" + disk
		out = append(out,
			&v1alpha1.DiskImage{
				TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.SchemeGroupVersion.String(), Kind: v1alpha1.DiskImageKind},
				ObjectMeta: metav1.ObjectMeta{Name: name},
				Spec: v1alpha1.DiskImageSpec{ForProvider: v1alpha1.DiskImageParameters{
					Format: &format,
					Source: v1alpha1.DiskImageSource{Backup: &v1alpha1.DiskImageBackupSource{Location: b.Spec.Location, ID: string(b.UID), Disk: disk}},
				}},
			},
			&v1alpha1.Volume{
				TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.SchemeGroupVersion.String(), Kind: v1alpha1.VolumeKind},
				ObjectMeta: metav1.ObjectMeta{Name: name},
				Spec: v1alpha1.VolumeSpec{ForProvider: v1alpha1.VolumeParameters{
					Size:        vol.Spec.ForProvider.Size,
					StoragePool: vol.Spec.ForProvider.StoragePool,
					Source:      &v1alpha1.VolumeSource{DiskImageRef: &v1alpha1.LocalReference{Name: v1alpha1.LocalName(name)}},
				}},
			})
		fp.DiskAttachments[i].Name = v1alpha1.LocalName(name)
	}
	vm := &v1alpha1.VirtualMachine{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.SchemeGroupVersion.String(), Kind: v1alpha1.VirtualMachineKind},
		ObjectMeta: metav1.ObjectMeta{Name: f.name},
		Spec:       v1alpha1.VirtualMachineSpec{ForProvider: fp},
	}
	vm.Spec.ProviderConfigReference = src.Spec.ProviderConfigReference
	out = append(out, vm)
	// Nothing is made unless all of it can be: a name taken would leave
	// the restore half made.
	for _, o := range out {
		u, err := toUnstructured(o)
		if err != nil {
			return nil, err
		}
		_, err = f.dc.Resource(resourceOf(u.GetKind())).Namespace(f.namespace).Get(ctx, u.GetName(), metav1.GetOptions{})
		switch {
		case err == nil:
			return nil, fmt.Errorf("%s %s/%s exists already: choose another name for the new VM", u.GetKind(), f.namespace, u.GetName())
		case !kerrors.IsNotFound(err):
			return nil, err
		}
	}
	return out, nil
}

func toUnstructured(o runtime.Object) (*unstructured.Unstructured, error) {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(o)
	return &unstructured.Unstructured{Object: m}, err
}

// createAll creates objs in order, saying so.
func (e *env) createAll(ctx context.Context, dc dynamic.Interface, namespace string, objs []runtime.Object) error {
	for _, o := range objs {
		u, err := toUnstructured(o)
		if err != nil {
			return err
		}
		made, err := dc.Resource(resourceOf(u.GetKind())).Namespace(namespace).Create(ctx, u, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("cannot create %s %s/%s: %w", u.GetKind(), namespace, u.GetName(), err)
		}
		fmt.Fprintf(e.out, "%s %s/%s created\n", made.GetKind(), namespace, made.GetName())
	}
	return nil
}

// resourceOf is the resource of the kinds a restore from a backup makes.
func resourceOf(kind string) schema.GroupVersionResource {
	switch kind {
	case v1alpha1.DiskImageKind:
		return diskImages
	case v1alpha1.VolumeKind:
		return volumes
	}
	return vms
}

func (f fromBackup) get(ctx context.Context, gvr schema.GroupVersionResource, name string, into any) error {
	u, err := f.dc.Resource(gvr).Namespace(f.namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	return runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, into)
}

// restoreFromBackup makes VM name again from backup, and with a timeout
// waits until it runs.
func (e *env) restoreFromBackup(ctx context.Context, name, backup string, timeout time.Duration) error {
	dc, ns, err := e.dynamic()
	if err != nil {
		return err
	}
	objs, err := fromBackup{dc: dc, namespace: ns, name: name}.plan(ctx, backup)
	if err != nil {
		return err
	}
	if err := e.createAll(ctx, dc, ns, objs); err != nil {
		return err
	}
	if timeout <= 0 {
		return nil
	}
	return e.waitFor(ctx, dc, vms, ns, name, timeout, finished(func(got *v1alpha1.VirtualMachine) (bool, bool, string, string) {
		p := got.Status.AtProvider.Phase
		return p == v1alpha1.PhaseRunning || p == v1alpha1.PhaseFailed, p == v1alpha1.PhaseRunning, string(p), got.GetCondition("Ready").Message
	}))
}
