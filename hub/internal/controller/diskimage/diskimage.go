// Package diskimage describes DiskImages to the inuse controller: their users
// are the Volumes made from them, and their status is read from those Volumes
// and from the VirtualMachines using them.
//
// The hub has no report of its own per image: nodes are the nodes the image's
// Volumes are bound to (where the agent imports it), and the phase follows the
// VMs booting from those Volumes — Importing while one shows import progress,
// Failed while one fails on the image, Ready once one got past provisioning.
// An image pruned from a node after its last Volume there went is therefore
// no longer listed once that Volume is deleted, which is when pruning can
// start; the pruning itself happens on the node after pruneAfter.
package diskimage

import (
	"context"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/controller/inuse"
	"github.com/virtfleet/virtfleet/hub/internal/controller/virtualmachine"
)

// Kind is the DiskImage kind for inuse.SetupGated.
var Kind = inuse.Kind[*v1alpha1.DiskImage]{
	GroupKind:        v1alpha1.DiskImageGroupKind,
	GroupVersionKind: v1alpha1.DiskImageGroupVersionKind,
	New:              func() *v1alpha1.DiskImage { return &v1alpha1.DiskImage{} },
	User: inuse.User{
		Kind:    v1alpha1.VolumeKind,
		New:     func() client.Object { return &v1alpha1.Volume{} },
		NewList: func() client.ObjectList { return &v1alpha1.VolumeList{} },
		Index:   virtualmachine.IndexImages,
		Uses: func(o client.Object) []string {
			v, ok := o.(*v1alpha1.Volume)
			if !ok || v.Spec.ForProvider.Source == nil || v.Spec.ForProvider.Source.DiskImageRef == nil {
				return nil
			}
			return []string{string(v.Spec.ForProvider.Source.DiskImageRef.Name)}
		},
	},
	// A VM's phase says how the import of its boot image goes.
	Related: []inuse.Related{{Object: &v1alpha1.VirtualMachine{}, Names: imagesOf}},
	Observe: Observe,
}

// imagesOf names the DiskImages the Volumes of the VM o are made from.
func imagesOf(ctx context.Context, kube client.Reader, o client.Object) []string {
	vm, ok := o.(*v1alpha1.VirtualMachine)
	if !ok {
		return nil
	}
	var out []string
	for _, a := range vm.Spec.ForProvider.DiskAttachments {
		v := &v1alpha1.Volume{}
		if err := kube.Get(ctx, types.NamespacedName{Namespace: vm.Namespace, Name: string(a.Name)}, v); err != nil {
			continue
		}
		if src := v.Spec.ForProvider.Source; src != nil && src.DiskImageRef != nil {
			out = append(out, string(src.DiskImageRef.Name))
		}
	}
	return out
}

// vmState is what a VM booting from the image says about it.
type vmState struct {
	phase   v1alpha1.Phase
	message string
}

// Observe fills the image's status from the Volumes (users) made from it and
// the VMs using those, and returns its Ready condition.
func Observe(ctx context.Context, kube client.Reader, img *v1alpha1.DiskImage, users []string) (xpv2.Condition, error) {
	nodes := map[string]bool{}
	var states []vmState
	for _, name := range users {
		v := &v1alpha1.Volume{}
		if err := kube.Get(ctx, types.NamespacedName{Namespace: img.Namespace, Name: name}, v); err != nil {
			return xpv2.Condition{}, errors.Wrapf(err, "cannot get Volume %s", name)
		}
		if n := v.GetAnnotations()[v1alpha1.AnnotationNode]; n != "" {
			nodes[n] = true
		}
		vms, err := virtualmachine.Users(ctx, kube, virtualmachine.IndexVolumes, v)
		if err != nil {
			return xpv2.Condition{}, err
		}
		for _, vm := range vms {
			states = append(states, vmState{phase: vm.Status.AtProvider.Phase, message: vm.GetCondition(xpv2.TypeReady).Message})
		}
	}
	o := &img.Status.AtProvider
	o.Users = int32(len(users)) //nolint:gosec // a namespace holds far fewer than 2^31 Volumes
	o.Nodes = nil
	for n := range nodes {
		o.Nodes = append(o.Nodes, n)
	}
	sort.Strings(o.Nodes)
	o.Phase, o.Message = phase(img.Name, o.Phase, states)
	return condition(o.Phase, o.Message), nil
}

// phase derives the image's phase from its VMs; an image once Ready stays
// Ready while no VM says otherwise, since it stays on its nodes.
func phase(image string, was v1alpha1.ImagePhase, states []vmState) (v1alpha1.ImagePhase, string) {
	var importing, failed string
	ready := false
	for _, s := range states {
		about := strings.Contains(s.message, "image "+image+":") || strings.Contains(s.message, "image "+image+" ")
		switch {
		case s.phase == v1alpha1.PhaseFailed && about:
			failed = s.message
		case s.phase == v1alpha1.PhaseProvisioning && about:
			importing = s.message
		case s.phase == v1alpha1.PhaseStarting || s.phase == v1alpha1.PhaseRunning ||
			s.phase == v1alpha1.PhaseStopping || s.phase == v1alpha1.PhaseStopped:
			ready = true
		}
	}
	switch {
	case failed != "":
		return v1alpha1.ImagePhaseFailed, failed
	case importing != "":
		return v1alpha1.ImagePhaseImporting, importing
	case ready || was == v1alpha1.ImagePhaseReady:
		return v1alpha1.ImagePhaseReady, ""
	default:
		return v1alpha1.ImagePhasePending, ""
	}
}

func condition(p v1alpha1.ImagePhase, msg string) xpv2.Condition {
	if p == v1alpha1.ImagePhaseReady {
		return xpv2.Available()
	}
	if msg == "" && p == v1alpha1.ImagePhasePending {
		msg = "imported on a node when a VM booting from one of its Volumes is placed there"
	}
	return xpv2.Condition{Type: xpv2.TypeReady, Status: corev1.ConditionFalse, Reason: xpv2.ConditionReason(p), Message: msg, LastTransitionTime: metav1.Now()}
}
