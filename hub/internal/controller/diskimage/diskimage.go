// Package diskimage describes DiskImages to the inuse controller: their users
// are the Volumes made from them, and their status is what the nodes report
// of them.
//
// Each node's agent reports the images it holds (an ImageReport per image
// and node: Importing with progress, Ready with size, Failed with the
// reason; the key is deleted when the image is pruned), so nodes lists where
// the image is present — also after its last Volume there went, until the
// node prunes it after pruneAfter. A lost node's images stay listed: they are
// still on its disk, and the hub learns otherwise only from the node.
//
// Where no node reports the image (an agent too old to report images, or
// the moment before the first report) status falls back to what the Volumes
// and VMs say: nodes are the nodes the image's Volumes are bound to, and the
// phase follows the VMs booting from them — Importing while one shows import
// progress, Failed while one fails on the image, Ready once one got past
// provisioning.
package diskimage

import (
	"context"
	"slices"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/crossplane/crossplane-runtime/v2/pkg/controller"
	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/controller/index"
	"github.com/virtfleet/virtfleet/hub/internal/controller/inuse"
	"github.com/virtfleet/virtfleet/hub/internal/controller/providerconfig"
	"github.com/virtfleet/virtfleet/hub/internal/fleet"
	"github.com/virtfleet/virtfleet/hub/internal/perobject"
	"github.com/virtfleet/virtfleet/hub/internal/wake"
)

// SetupGated adds the DiskImage controller once the CRD is established, with
// the nodes' image reports (see NewKind).
func SetupGated(mgr ctrl.Manager, o controller.Options, pool *fleet.Pool, notifier *wake.Notifier, memory *perobject.Owner, polls *wake.Polls) error {
	return inuse.SetupGated(mgr, o, NewKind(mgr.GetClient(), pool, notifier), memory, polls)
}

// NewKind is Kind with the nodes' image reports: it reads them from the
// fleets of pool, reached through each DiskImage's ProviderConfig, and is
// woken by notifier, which the Pool's fleets must feed with
// Fleet.Images.Subscribe.
func NewKind(kube client.Client, pool *fleet.Pool, notifier *wake.Notifier) inuse.Kind[*v1alpha1.DiskImage] {
	r := &reports{configs: providerconfig.NewResolver(kube), pool: pool, notifier: notifier}
	k := Kind
	k.Observe = func(ctx context.Context, kube client.Reader, img *v1alpha1.DiskImage, users inuse.Users) (xpv2.Condition, error) {
		got, err := r.of(ctx, kube, img, users)
		if err != nil {
			return xpv2.Condition{}, err
		}
		return observe(ctx, kube, img, users, got)
	}
	k.Sources = []source.Source{notifier.Source()}
	return k
}

// reports reads the nodes' reports of DiskImages.
type reports struct {
	configs  *providerconfig.Resolver
	pool     *fleet.Pool
	notifier *wake.Notifier
}

// of returns the reports of img from the nodes it is placed on. A DiskImage
// being deleted whose ProviderConfig cannot be read gets none rather than an
// error, so that its deletion never waits on it.
func (r *reports) of(ctx context.Context, kube client.Reader, img *v1alpha1.DiskImage, users inuse.Users) ([]wire.ImageReport, error) {
	r.notifier.Remember(img)
	if img.GetProviderConfigReference() == nil {
		return nil, nil
	}
	pc, err := r.configs.Resolve(ctx, img)
	if err != nil {
		if meta.WasDeleted(img) {
			return nil, nil
		}
		return nil, err
	}
	f, err := r.pool.Get(ctx, pc.Target)
	if err != nil {
		if meta.WasDeleted(img) {
			return nil, nil
		}
		return nil, err
	}
	placed := placedOn(img, users)
	f.Images.FlagForeign(img, placed...)
	out := make([]wire.ImageReport, 0, len(placed))
	for _, node := range placed {
		if rep, ok := f.Images.Report(node, string(img.UID)); ok {
			out = append(out, rep.Report)
		}
	}
	return out, nil
}

// placedOn are the nodes an image is placed on: those its Volumes (users)
// are bound to, where the hub asked for it, and those its status already
// lists, where it stays after its last Volume there went until the node
// prunes it. A node can only ever join the list through a Volume bound to
// it, so no node can place an image on itself by reporting it.
func placedOn(img *v1alpha1.DiskImage, users inuse.Users) []string {
	nodes := append([]string(nil), img.Status.AtProvider.Nodes...)
	for _, v := range users {
		if n := v.GetAnnotations()[v1alpha1.AnnotationNode]; n != "" {
			nodes = append(nodes, n)
		}
	}
	sort.Strings(nodes)
	return slices.Compact(nodes)
}

// Kind is the DiskImage kind for inuse.SetupGated without the nodes' image
// reports: its status comes from the Volumes and VMs alone (see NewKind).
var Kind = inuse.Kind[*v1alpha1.DiskImage]{
	GroupKind:        v1alpha1.DiskImageGroupKind,
	GroupVersionKind: v1alpha1.DiskImageGroupVersionKind,
	New:              func() *v1alpha1.DiskImage { return &v1alpha1.DiskImage{} },
	User:             index.ImageUsers,
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
func Observe(ctx context.Context, kube client.Reader, img *v1alpha1.DiskImage, users inuse.Users) (xpv2.Condition, error) {
	return observe(ctx, kube, img, users, nil)
}

// observe fills the image's status from the nodes' reports of it, or, when
// no node reports it, from its Volumes and their VMs.
func observe(ctx context.Context, kube client.Reader, img *v1alpha1.DiskImage, users inuse.Users, reports []wire.ImageReport) (xpv2.Condition, error) {
	o := &img.Status.AtProvider
	o.Users = int32(len(users)) //nolint:gosec // a namespace holds far fewer than 2^31 Volumes
	if s, ok := fromReports(reports); ok {
		o.Nodes, o.Phase, o.Message = s.nodes, s.phase, s.message
		if s.size > 0 {
			o.Size = resource.NewQuantity(s.size, resource.BinarySI)
		}
		return condition(o.Phase, o.Message), nil
	}
	return observeUsers(ctx, kube, img, users)
}

// nodesSay is what the nodes' reports say of an image.
type nodesSay struct {
	// nodes are where the image is present, sorted.
	nodes   []string
	size    int64
	phase   v1alpha1.ImagePhase
	message string
}

// fromReports sums up the nodes' reports of one image; ok is false when
// there are none. A failure on any node makes the image Failed, an import
// on any node Importing — as the VMs waiting for it see it — and otherwise
// it is Ready on the nodes that have it. Messages name their node.
func fromReports(reports []wire.ImageReport) (nodesSay, bool) {
	if len(reports) == 0 {
		return nodesSay{}, false
	}
	sorted := append([]wire.ImageReport(nil), reports...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Node < sorted[j].Node })
	var s nodesSay
	var importing, failed []string
	for _, r := range sorted {
		switch r.Phase {
		case wire.ImagePhaseReady:
			s.nodes = append(s.nodes, r.Node)
			s.size = max(s.size, r.SizeBytes)
		case wire.ImagePhaseImporting:
			importing = append(importing, r.Node+": "+r.Message)
		case wire.ImagePhaseFailed:
			failed = append(failed, r.Node+": "+r.Message)
		}
	}
	switch {
	case len(failed) > 0:
		s.phase, s.message = v1alpha1.ImagePhaseFailed, strings.Join(failed, "; ")
	case len(importing) > 0:
		s.phase, s.message = v1alpha1.ImagePhaseImporting, strings.Join(importing, "; ")
	default:
		s.phase = v1alpha1.ImagePhaseReady
	}
	return s, true
}

// observeUsers fills the image's status from its Volumes and their VMs.
func observeUsers(ctx context.Context, kube client.Reader, img *v1alpha1.DiskImage, users inuse.Users) (xpv2.Condition, error) {
	nodes := map[string]bool{}
	var states []vmState
	for _, v := range users {
		if n := v.GetAnnotations()[v1alpha1.AnnotationNode]; n != "" {
			nodes[n] = true
		}
		vms, err := index.VirtualMachines(ctx, kube, index.VolumeUsers, v)
		if err != nil {
			return xpv2.Condition{}, err
		}
		for _, vm := range vms {
			states = append(states, vmState{phase: vm.Status.AtProvider.Phase, message: vm.GetCondition(xpv2.TypeReady).Message})
		}
	}
	o := &img.Status.AtProvider
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
		case s.phase == v1alpha1.PhaseStarting || s.phase == v1alpha1.PhaseRunning || s.phase == v1alpha1.PhasePaused ||
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
