// Package placementgroup shows in each PlacementGroup's status which VMs
// name it, the node and topology domain each is on, and whether they keep
// its policy, so `kubectl get pg` answers "are my replicas apart?". The
// placement loop enforces the policy (virtualmachine.GroupOf); this only
// reports.
package placementgroup

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/crossplane/crossplane-runtime/v2/pkg/controller"
	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/controller/index"
	"github.com/virtfleet/virtfleet/hub/internal/controller/virtualmachine"
	"github.com/virtfleet/virtfleet/hub/internal/fleet"
	"github.com/virtfleet/virtfleet/hub/internal/placement"
)

// recount is how often a group is looked at regardless: a node's labels,
// and so its VMs' domains, come with its heartbeats, which wake no
// reconcile here.
const recount = 30 * time.Second

// SetupGated adds the controller once the CRDs it reads are established.
func SetupGated(mgr ctrl.Manager, o controller.Options, fleets func() []*fleet.Fleet) error {
	o.Gate.Register(func() {
		if err := Setup(mgr, o, fleets); err != nil {
			panic(errors.Wrap(err, "cannot set up the PlacementGroup controller"))
		}
	}, v1alpha1.PlacementGroupGroupVersionKind, v1alpha1.VirtualMachineGroupVersionKind)
	return nil
}

// Setup adds the controller. fleets are the fleets the VMs may be in.
func Setup(mgr ctrl.Manager, o controller.Options, fleets func() []*fleet.Fleet) error {
	r := &Reconciler{kube: mgr.GetClient(), fleets: fleets, log: o.Logger.WithValues("controller", "placementgroup")}
	return ctrl.NewControllerManagedBy(mgr).
		Named("placementgroup").
		For(&v1alpha1.PlacementGroup{}).
		Watches(&v1alpha1.VirtualMachine{}, handler.EnqueueRequestsFromMapFunc(groupOf)).
		WithOptions(o.ForControllerRuntime()).
		Complete(r)
}

// groupOf requests the group a VM names; an update maps the VM as it was
// too, so the group a VM leaves is requested as well.
func groupOf(_ context.Context, o client.Object) []reconcile.Request {
	vm, ok := o.(*v1alpha1.VirtualMachine)
	if !ok || vm.Spec.ForProvider.PlacementGroup == nil {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: vm.Namespace, Name: string(*vm.Spec.ForProvider.PlacementGroup)}}}
}

// Reconciler writes a PlacementGroup's status.
type Reconciler struct {
	kube   client.Client
	fleets func() []*fleet.Fleet
	log    logging.Logger
}

// Reconcile finds the group's VMs and where they are, and writes that when
// it changed.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	pg := &v1alpha1.PlacementGroup{}
	if err := r.kube.Get(ctx, req.NamespacedName, pg); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(errors.Wrap(err, "cannot read the PlacementGroup"))
	}
	members, err := index.VirtualMachines(ctx, r.kube, index.PlacementGroupMembers, pg)
	if err != nil {
		return reconcile.Result{}, err
	}
	fleets := r.fleets()
	g := &placement.Group{TopologyKey: pg.Spec.TopologyKey}
	want := v1alpha1.PlacementGroupStatus{Conditions: slices.Clone(pg.Status.Conditions)}
	byDomain := map[string][]string{}
	for i := range members {
		m := &members[i]
		vm := v1alpha1.PlacementGroupVM{Name: m.Name}
		node := m.GetAnnotations()[v1alpha1.AnnotationNode]
		on, err := virtualmachine.IsOn(ctx, r.kube, m, node, fleets)
		if err != nil {
			return reconcile.Result{}, errors.Wrapf(err, "cannot tell where VM %s is", m.Name)
		}
		if on {
			vm.Node, vm.Domain = node, g.Domain(nodeOf(fleets, node))
			byDomain[vm.Domain] = append(byDomain[vm.Domain], m.Name)
			want.Placed++
		}
		want.VMs = append(want.VMs, vm)
	}
	slices.SortFunc(want.VMs, func(a, b v1alpha1.PlacementGroupVM) int { return strings.Compare(a.Name, b.Name) })
	want.Domains = int32(len(byDomain))
	meta.SetStatusCondition(&want.Conditions, satisfied(pg, byDomain, int(want.Placed), len(members)))
	if equality.Semantic.DeepEqual(pg.Status, want) {
		return reconcile.Result{RequeueAfter: recount}, nil
	}
	pg.Status = want
	if err := r.kube.Status().Update(ctx, pg); err != nil && !kerrors.IsConflict(err) {
		return reconcile.Result{}, errors.Wrap(err, "cannot show where the group's VMs are")
	}
	return reconcile.Result{RequeueAfter: recount}, nil
}

// nodeOf is node as the first of fleets that hears from it has it, with
// its labels; a node none does (lost, or not heard from yet) is known by
// its name alone, a domain of its own.
func nodeOf(fleets []*fleet.Fleet, node string) placement.Node {
	for _, f := range fleets {
		if n, ok := f.Placeable(node); ok {
			return n
		}
	}
	return placement.Node{Name: node}
}

// satisfied is the Satisfied condition of pg, whose placed VMs are in the
// domains of byDomain, placed of total.
func satisfied(pg *v1alpha1.PlacementGroup, byDomain map[string][]string, placed, total int) metav1.Condition {
	c := metav1.Condition{Type: v1alpha1.PlacementGroupSatisfied, Status: metav1.ConditionTrue, ObservedGeneration: pg.Generation}
	var broken []string
	switch pg.Spec.Policy {
	case v1alpha1.PlacementAntiAffinity:
		for _, d := range slices.Sorted(maps.Keys(byDomain)) {
			if vms := byDomain[d]; len(vms) > 1 {
				slices.Sort(vms)
				broken = append(broken, fmt.Sprintf("%s share %s", strings.Join(vms, ", "), d))
			}
		}
	case v1alpha1.PlacementAffinity:
		if len(byDomain) > 1 {
			for _, d := range slices.Sorted(maps.Keys(byDomain)) {
				vms := byDomain[d]
				slices.Sort(vms)
				broken = append(broken, fmt.Sprintf("%s in %s", strings.Join(vms, ", "), d))
			}
		}
	}
	if len(broken) > 0 {
		c.Status, c.Reason = metav1.ConditionFalse, "PolicyBroken"
		c.Message = fmt.Sprintf("the %s policy does not hold: %s", pg.Spec.Policy, strings.Join(broken, "; "))
		return c
	}
	c.Reason = "PolicyHolds"
	c.Message = fmt.Sprintf("%d of %d VMs placed, in %d domains, as the %s policy asks", placed, total, len(byDomain), pg.Spec.Policy)
	if placed < total {
		c.Message += fmt.Sprintf("; %d not placed yet (see their Ready condition)", total-placed)
	}
	return c
}
