package volume

import (
	"context"
	"fmt"
	"sort"

	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/bus"
	"github.com/virtfleet/virtfleet/hub/internal/controller/inuse"
	"github.com/virtfleet/virtfleet/hub/internal/quota"
)

// A Volume whose crossplane.io/external-name names an existing volume of
// the node given by compute.virtfleet.io/node imports it instead of having
// one made: the hub writes a present VolumeIntent with that ExternalName,
// the node reports the volume's real size and id, and nothing changes it.
// The management policies decide the rest, as for a VM's imported guest:
// without Delete, deleting the Volume leaves the volume (the managed
// reconciler never calls Release, and Leftovers then removes the intent and
// report); with it, Release has the node delete it.

// intentOf is the VolumeIntent naming v's volume on its node: the one v
// imports, or its own.
func intentOf(v *v1alpha1.Volume) wire.VolumeIntent {
	in := wire.VolumeIntent{UID: string(v.UID), Namespace: v.Namespace, Name: v.Name, Disk: wire.NameOnNode(v.Namespace, v.Name), Pool: v.Spec.ForProvider.StoragePool}
	if ext := meta.GetExternalName(v); ext != "" {
		in.Disk, in.ExternalName = ext, ext
	}
	return in
}

// Observe is inuse.Kind.Observe for Volumes: a Volume that imports a volume
// shows the volume as its node reports it.
func (r *Releaser) Observe(ctx context.Context, kube client.Reader, v *v1alpha1.Volume, users inuse.Users) (xpv2.Condition, error) {
	ready, err := observe(ctx, kube, v, users)
	ext := meta.GetExternalName(v)
	if err == nil && ext == "" && r.quotas != nil {
		if v.Status.AtProvider.Node != "" {
			return r.growable(ctx, v, ready)
		}
		return r.admissible(ctx, v, ready)
	}
	if err != nil || ext == "" {
		return ready, err
	}
	at := &v.Status.AtProvider
	node := at.Node
	if node == "" {
		at.Phase = v1alpha1.PhaseFailed
		return xpv2.Unavailable().WithMessage(fmt.Sprintf("the Volume imports volume %q: set the annotation %s to the node that has it", ext, v1alpha1.AnnotationNode)), nil
	}
	refusal, err := r.importRefusal(ctx, v, ext)
	if err != nil {
		return ready, err
	}
	if refusal != nil {
		// Nothing is asked of the node, so nothing of its volume is
		// revealed, and nothing of it is deleted with the Volume.
		at.Phase = v1alpha1.PhaseFailed
		return xpv2.Unavailable().WithMessage(refusal.Error()), nil
	}
	f, err := r.fleetOf(ctx, v)
	if err != nil {
		return ready, err
	}
	owner, err := firstImporter(ctx, kube, v, node)
	if err != nil {
		return ready, err
	}
	if owner != nil {
		at.Phase = v1alpha1.PhaseFailed
		by := "a Volume of another namespace"
		if owner.Namespace == v.Namespace {
			by = "Volume " + owner.Name
		}
		return xpv2.Unavailable().WithMessage(fmt.Sprintf("volume %s on node %s is already managed by %s; a volume has one Volume", ext, node, by)), nil
	}
	uid := string(v.UID)
	if in := intentOf(v); !meta.WasDeleted(v) {
		// A deleted Volume's intent is Release's.
		// A Volume in a shared pool moves with its VM's restart: the
		// node it is bound to now is asked too.
		if last, ok := r.published.Load(v.UID); !ok || last != (publishedIntent{node: node, intent: in}) {
			if _, err := bus.Put(ctx, f.Bus, wire.VolumeIntents, node, in.UID, in); err != nil {
				return ready, errors.Wrapf(err, "cannot ask node %s to observe volume %s", node, ext)
			}
			r.published.Store(v.UID, publishedIntent{node: node, intent: in})
		}
	}
	f.Volumes.FlagForeign(v, node)
	rep, ok := f.Volumes.Report(node, uid)
	switch {
	case !ok || !rep.Report.Imported:
		at.Phase = v1alpha1.PhasePending
		return xpv2.Unavailable().WithMessage(fmt.Sprintf("waiting for node %s to report volume %s", node, ext)), nil
	case rep.Report.Message != "":
		at.Phase = v1alpha1.PhaseFailed
		return xpv2.Unavailable().WithMessage(rep.Report.Message), nil
	}
	at.ID, at.Capacity = rep.Report.ID, resource.NewQuantity(rep.Report.SizeBytes, resource.BinarySI)
	return ready, nil
}

// admissible is ready of v, on no node, unless making it now would pass
// its namespace's quota: then it is Unavailable, saying which limit. The
// VM that would make it stays Pending for the same reason.
func (r *Releaser) admissible(ctx context.Context, v *v1alpha1.Volume, ready xpv2.Condition) (xpv2.Condition, error) {
	var exceeded *quota.ExceededError
	switch err := r.quotas.FitsVolume(ctx, v); {
	case errors.As(err, &exceeded):
		return xpv2.Unavailable().WithMessage("made on no node: " + err.Error()), nil
	case err != nil:
		return ready, err
	}
	return ready, nil
}

// growable is ready, v's Ready condition, saying why v keeps its size when
// its namespace's quota holds its growth: Available still, at the size it
// has, naming the limit.
func (r *Releaser) growable(ctx context.Context, v *v1alpha1.Volume, ready xpv2.Condition) (xpv2.Condition, error) {
	var exceeded *quota.ExceededError
	switch size, err := r.quotas.HeldGrowth(ctx, v); {
	case errors.As(err, &exceeded):
		return ready.WithMessage(fmt.Sprintf("keeps its size of %s: %v", resource.NewQuantity(size, resource.BinarySI), err)), nil
	case err != nil:
		return ready, err
	}
	return ready, nil
}

// firstImporter is the Volume that imported v's volume on node before v,
// if another did: the oldest Volume of that node naming it, by creation and
// then namespace/name, manages it.
func firstImporter(ctx context.Context, kube client.Reader, v *v1alpha1.Volume, node string) (*v1alpha1.Volume, error) {
	all := &v1alpha1.VolumeList{}
	if err := kube.List(ctx, all); err != nil {
		return nil, errors.Wrap(err, "cannot list Volumes")
	}
	ext := meta.GetExternalName(v)
	var same []v1alpha1.Volume
	for _, o := range all.Items {
		if o.GetAnnotations()[v1alpha1.AnnotationNode] == node && intentOf(&o).Disk == ext {
			same = append(same, o)
		}
	}
	sort.Slice(same, func(i, j int) bool {
		a, b := same[i], same[j]
		if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
			return a.CreationTimestamp.Before(&b.CreationTimestamp)
		}
		return a.Namespace+"/"+a.Name < b.Namespace+"/"+b.Name
	})
	if len(same) == 0 || same[0].UID == v.UID {
		return nil, nil
	}
	return &same[0], nil
}
