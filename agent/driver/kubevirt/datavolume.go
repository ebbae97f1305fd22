package kubevirt

import (
	"cmp"
	"context"
	"fmt"
	"net/url"
	"os"
	"strings"

	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/agent/driver/imageimport"
)

// What virtfleet writes on the DataVolumes it makes for disks from images,
// besides labelManagedBy. CDI copies a DataVolume's labels and annotations
// to the PVC it makes, so the PVC carries them too.
const (
	// LabelImageUID is the uid of the DiskImage the disk was imported from.
	LabelImageUID = "virtfleet.io/image-uid"
	// AnnotationImageName is that DiskImage's name, for people looking at
	// the target cluster.
	AnnotationImageName = "virtfleet.io/image-name"
)

// minDataVolumeBytes is the smallest size CDI's admission webhook takes for
// a DataVolume (KubeVirt attaches no smaller disk).
const minDataVolumeBytes = 1 << 20

// errNoCDI explains a cluster that serves no DataVolumes.
const errNoCDI = "the KubeVirt cluster serves no cdi.kubevirt.io/v1beta1 DataVolumes; install CDI there to make disks from images"

// checkImageSource applies the node's source policy (imageimport) to an
// image before CDI is asked to download it, and returns the progress of a
// check still running. An image without a SHA256 is checked by its URL
// alone (imageimport.CheckSource): its scheme, and the addresses its host
// resolves to. One with a SHA256 is downloaded by the agent itself, within
// the node's limits, and its checksum verified, once per image; CDI, which
// verifies no checksum of an http import, is asked only after. Either way
// CDI fetches the URL again from inside the cluster, resolving the host
// and following redirects anew: the check holds for the source as it was
// when checked, not against a server that changes what it serves. A URL
// the policy refuses, or bytes that fail the checksum, give a Terminal or
// Failing error as on the other backends.
func (d *Driver) checkImageSource(ctx context.Context, img *driver.Image) (string, error) {
	if _, err := url.Parse(img.URL); err != nil {
		return "", driver.Terminalf("image %s: bad URL %q: %v", img.Name, img.URL, err)
	}
	if img.SHA256 == "" {
		err := imageimport.CheckSource(ctx, img.URL, img.AllowedSources)
		if imageimport.IsRefusal(err) {
			return "", driver.Terminal(errors.Wrapf(err, "image %s", img.Name))
		}
		return "", errors.Wrapf(err, "cannot check the source of image %s", img.Name)
	}
	key := imageimport.InputOf(img)
	present := func() (bool, error) {
		d.verifiedMu.Lock()
		defer d.verifiedMu.Unlock()
		return d.verified[img.UID] == key, nil
	}
	return d.verify.Ensure(d.ctx, img, present, func(ctx context.Context, img *driver.Image, job *imageimport.Job) error {
		path, _, err := job.Download(ctx, img)
		if err != nil {
			return err
		}
		_ = os.Remove(path)
		d.verifiedMu.Lock()
		defer d.verifiedMu.Unlock()
		d.verified[img.UID] = imageimport.InputOf(img)
		return nil
	})
}

// importable refuses, as terminal, a disk whose image CDI cannot import as
// the contract asks: from a volume or a backup rather than a URL, or into
// a volume smaller than CDI takes.
func importable(disk driver.Disk) error {
	img := disk.Image
	switch {
	case img.Backup != nil:
		return driver.Terminalf("disk %s is made from image %s, which is a disk of backup %s/%s: the kubevirt backend cannot make an image from a backup yet", disk.Name, img.Name, img.Backup.Namespace, img.Backup.ID)
	case img.ExternalName != "":
		return driver.Terminalf("disk %s is made from image %s, which imports %q by external name: the kubevirt backend imports images from http and https URLs only", disk.Name, img.Name, img.ExternalName)
	case img.SourceSnapshot != "":
		return driver.Terminalf("disk %s is made from image %s, a copy of volume %s as it was in snapshot %s: the kubevirt backend keeps that snapshot as KubeVirt's own and makes no DataVolume of one; "+
			"restore the snapshot into its VM (VirtualMachineRestore) instead", disk.Name, img.Name, img.SourceVolume, img.SourceSnapshot)
	case img.SourceVolume != "" || img.URL == "":
		return driver.Terminalf("disk %s is made from image %s, which has no URL: the kubevirt backend imports images from http and https URLs only", disk.Name, img.Name)
	case disk.SizeBytes < minDataVolumeBytes:
		return driver.Terminalf("disk %s is made from image %s and needs a size of at least 1Mi on the kubevirt backend: CDI imports into a volume of the size asked for, got %d bytes", disk.Name, img.Name, disk.SizeBytes)
	}
	if errs := validation.IsValidLabelValue(img.UID); img.UID == "" || len(errs) > 0 {
		return driver.Terminalf("image %s: uid %q cannot label a DataVolume: %s", img.Name, img.UID, strings.Join(errs, "; "))
	}
	return nil
}

// newDataVolume is the DataVolume that imports disk's image into the PVC
// of the disk's name: an http import into storage of the disk's size, with
// the driver's access mode, in the disk's pool (a storage class) or the
// default one. CDI's storage profile gives the volume mode.
func newDataVolume(disk driver.Disk, namespace string, accessMode corev1.PersistentVolumeAccessMode) (*cdiv1.DataVolume, error) {
	if err := importable(disk); err != nil {
		return nil, err
	}
	storage := &cdiv1.StorageSpec{
		AccessModes: []corev1.PersistentVolumeAccessMode{accessMode},
		Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: *resource.NewQuantity(disk.SizeBytes, resource.BinarySI)}},
	}
	if disk.Pool != "" {
		storage.StorageClassName = ptr(disk.Pool)
	}
	return &cdiv1.DataVolume{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:   namespace,
			Name:        ObjectName(disk.Name),
			Labels:      map[string]string{labelManagedBy: managedBy, LabelImageUID: disk.Image.UID},
			Annotations: map[string]string{AnnotationImageName: disk.Image.Name},
		},
		Spec: cdiv1.DataVolumeSpec{
			Source:  &cdiv1.DataVolumeSource{HTTP: &cdiv1.DataVolumeSourceHTTP{URL: disk.Image.URL}},
			Storage: storage,
		},
	}, nil
}

// ensureDataVolume makes the DataVolume that fills disk from its image
// when the disk is missing: neither a PVC nor a DataVolume of its name
// exists. An existing one, whoever made it and from whatever, is left as
// it is: a disk is never rewritten from its image. Only a DataVolume about
// to be made is checked against the node's source policy; while that
// check runs, its progress is returned and nothing is made.
func (d *Driver) ensureDataVolume(ctx context.Context, c client.Client, disk driver.Disk) (string, error) {
	name := ObjectName(disk.Name)
	key := types.NamespacedName{Namespace: d.namespace, Name: name}
	switch err := d.live.Get(ctx, key, &corev1.PersistentVolumeClaim{}); {
	case err == nil:
		return "", nil
	case !kerrors.IsNotFound(err):
		return "", errors.Wrapf(err, "cannot get PVC %s", name)
	}
	switch err := d.live.Get(ctx, key, &cdiv1.DataVolume{}); {
	case err == nil:
		return "", nil
	case meta.IsNoMatchError(err):
		return "", driver.Failing(errors.Wrap(err, errNoCDI))
	case !kerrors.IsNotFound(err):
		return "", errors.Wrapf(err, "cannot get DataVolume %s", name)
	}
	dv, err := newDataVolume(disk, d.namespace, d.accessMode)
	if err != nil {
		return "", err
	}
	if progress, err := d.checkImageSource(ctx, disk.Image); err != nil || progress != "" {
		return progress, err
	}
	err = c.Create(ctx, dv)
	switch {
	case err == nil, kerrors.IsAlreadyExists(err):
		return "", nil
	case meta.IsNoMatchError(err):
		return "", driver.Failing(errors.Wrap(err, errNoCDI))
	case kerrors.IsInvalid(err), kerrors.IsBadRequest(err):
		return "", driver.Terminal(errors.Wrapf(err, "the KubeVirt cluster rejected DataVolume %s", name))
	default:
		return "", errors.Wrapf(err, "cannot create DataVolume %s", name)
	}
}

// imports reports the imports of m's disks from images on o, the guest's
// observation, while the guest does not run (a guest that runs has its
// disks): Provisioning, with CDI's progress of each import still running,
// or an IsFailing error with CDI's reason when one has failed or its
// importer stopped on an error (CDI restarts it, and the import may yet
// succeed). A DataVolume that waits for its first consumer (the guest's
// pod) or for its population counts as done, as KubeVirt counts it; a disk
// that is no DataVolume's (a PVC made otherwise, or a DataVolume CDI
// deleted once it had succeeded) has nothing to import. The DataVolumes
// are read from the API server, one read per disk from an image.
func (d *Driver) imports(ctx context.Context, m driver.Machine, o driver.Observation) (driver.Observation, error) {
	switch o.Phase {
	case driver.PhaseRunning, driver.PhasePaused, driver.PhaseStopping:
		return o, nil
	}
	var progress []string
	for _, disk := range m.Disks {
		if disk.Image == nil {
			continue
		}
		name := ObjectName(disk.Name)
		dv := &cdiv1.DataVolume{}
		switch err := d.live.Get(ctx, types.NamespacedName{Namespace: d.namespace, Name: name}, dv); {
		case kerrors.IsNotFound(err), meta.IsNoMatchError(err):
			continue
		case err != nil:
			return driver.Observation{}, errors.Wrapf(err, "cannot get DataVolume %s", name)
		}
		if why := importFailure(dv); why != "" {
			return driver.Observation{}, driver.Failingf("CDI cannot import image %s into DataVolume %s/%s: %s", disk.Image.Name, d.namespace, name, why)
		}
		if !importDone(dv) {
			progress = append(progress, fmt.Sprintf("importing image %s: %s", disk.Image.Name, importProgress(dv)))
		}
	}
	if len(progress) > 0 {
		o.Phase, o.Message = driver.PhaseProvisioning, strings.Join(progress, "; ")
	}
	return o, nil
}

// importDone is whether KubeVirt may start a guest on dv's PVC.
func importDone(dv *cdiv1.DataVolume) bool {
	switch dv.Status.Phase {
	case cdiv1.Succeeded, cdiv1.WaitForFirstConsumer, cdiv1.PendingPopulation:
		return true
	}
	return false
}

// importFailure is why dv's import fails, as KubeVirt tells a DataVolume
// error (HasDataVolumeErrors, HasDataVolumeExceededQuotaError): a Failed
// phase, an importer stopped by an error (Running False, reason Error or
// ImagePullFailed) with the restarts CDI counted, or a quota the PVC
// exceeds. Empty while nothing fails.
func importFailure(dv *cdiv1.DataVolume) string {
	running := condition(dv, cdiv1.DataVolumeRunning)
	bound := condition(dv, cdiv1.DataVolumeBound)
	switch {
	case running.Status == corev1.ConditionFalse && (running.Reason == "Error" || running.Reason == "ImagePullFailed"):
		return fmt.Sprintf("%s (%s; restarts: %d)", running.Message, running.Reason, dv.Status.RestartCount)
	case dv.Status.Phase == cdiv1.Failed:
		return fmt.Sprintf("DataVolume %s failed: %s", dv.Name, cmp.Or(running.Message, bound.Message, condition(dv, cdiv1.DataVolumeReady).Message, "no reason given"))
	case bound.Status != corev1.ConditionTrue && bound.Reason == "ErrExceededQuota":
		return bound.Message
	}
	return ""
}

// importProgress is CDI's progress of dv's import: the percentage it
// reports, else its phase.
func importProgress(dv *cdiv1.DataVolume) string {
	switch p := string(dv.Status.Progress); {
	case strings.HasSuffix(p, "%"):
		return p
	case dv.Status.Phase != "":
		return string(dv.Status.Phase)
	}
	return "waiting for CDI"
}

// condition is dv's condition of type t; the zero condition when it has
// none.
func condition(dv *cdiv1.DataVolume, t cdiv1.DataVolumeConditionType) cdiv1.DataVolumeCondition {
	for _, c := range dv.Status.Conditions {
		if c.Type == t {
			return c
		}
	}
	return cdiv1.DataVolumeCondition{}
}
