package kubevirttest

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"hash/fnv"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	kubevirtv1 "kubevirt.io/api/core/v1"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"
	"sigs.k8s.io/yaml"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
)

// Finalizer is the finalizer KubeVirt's virt-controller puts on every
// VirtualMachine: a deleted VM stays until its VMI is gone.
const Finalizer = "kubevirt.io/virtualMachineControllerFinalize"

// InfoSource is what virt-handler writes in status.interfaces[].infoSource
// when the guest agent reported the addresses.
const InfoSource = "domain, guest-agent, multus-status"

// Failure is a failure a test forces on a VirtualMachine: the printable
// status KubeVirt would show, and the message of the condition it would set.
type Failure struct {
	Status  kubevirtv1.VirtualMachinePrintableStatus
	Message string
}

// FakeVirtController plays virt-controller and virt-handler for the
// VirtualMachines of a test cluster, in-process: for a VM whose runStrategy
// is Always or RerunOnFailure it creates the VMI (same name, owned by the VM,
// the template's labels and annotations), moves it Pending → Scheduling →
// Scheduled → Running one step per StepInterval, puts it on a schedulable
// Ready Node and fills in status.nodeName and status.interfaces (a MAC per
// interface, the spec's macAddress when it asks for one, and an address per
// Multus network: the static one cloud-init network data gives the
// interface's MAC, else one from a pool of its own, kept across restarts
// of the VM as a DHCP lease would be); a finished or deleted
// VMI of such a VM is replaced by a new one. For Halted it deletes the VMI.
// Manual and Once VMs are left alone. A VMI paused through the subresource
// API (see virtAPI) shows the VM Paused. It keeps the VM's printableStatus,
// ready, created and conditions as KubeVirt does, plays the garbage collector
// for VMIs of deleted VMs, and holds KubeVirt's finalizer on VMs until their
// VMI is gone. A VM whose PVCs are missing shows ErrorPvcNotFound. Fail
// forces other failures. A running VMI is LiveMigratable unless a PVC it
// uses is not ReadWriteMany (virt-handler's DisksNotLiveMigratable).
//
// A volume that is a dataVolume (one the VM names, not a
// dataVolumeTemplate) is its DataVolume's PVC, as in KubeVirt: the VM
// controller creates the VMI at once, and the VMI stays Pending, with no
// node, until that PVC is populated (its DataVolume Succeeded or
// PendingPopulation; a PVC no DataVolume controls counts as populated, as
// CDI's IsSucceededOrPendingPopulation says). Meanwhile the VM shows
// DataVolumeError while a DataVolume failed or its importer stopped on an
// error (Running False, reason Error or ImagePullFailed), else Provisioning
// while one is bound and not Succeeded, else Starting — and so does a
// Halted VM, whose DataVolumes CDI fills all the same, before Stopped.
//
// It moves VMIs live as virt-controller and virt-handler do for a
// VirtualMachineInstanceMigration, one phase per StepInterval: Pending
// (once the VMI runs), Scheduling (the target pod, on a schedulable Ready
// node other than the VMI's that matches spec.addedNodeSelector),
// Scheduled, PreparingTarget (the VMI's status.migrationState names the
// source and target nodes), TargetReady (the target's address), Running
// (startTimestamp, mode PreCopy; the VM shows Migrating), then Succeeded
// (endTimestamp, completed, the VMI's status.nodeName is the target) or
// Failed. A finished migration gets the VMI's migrationState; the newest
// FinalizedMigrationsKept finished ones of a VMI are kept, and all go with
// the VMI. No virt-api runs, so what its admission webhook would refuse (a
// VMI that is absent, finished or not LiveMigratable, a second migration of
// a VMI) fails at once instead, with virt-api's message. Why a migration
// failed is in warning events on it, as virt-controller records it, and in
// migrationState.failureReason when virt-handler gave one
// (FailNextMigration); a target pod that fits no node fails the migration
// after DefaultUnschedulableTimeout. Deleting a migration that has not
// finished aborts it.
//
// It hot-plugs volumes as virt-controller and virt-handler do for the
// volume requests virt-api's addvolume and removevolume record on a VM
// (see hotplug.go), and CPU sockets and guest memory under the LiveUpdate
// rollout strategy (liveupdate.go), which a migration of the workload
// updater completes (workloadupdate.go).
type FakeVirtController struct {
	client client.Client
	// live reads the API server: a migration's steps must not act on what
	// the informers have not caught up with.
	live client.Reader
	step time.Duration

	// wake reconciles a VM whose forced failure was set or lifted: nothing
	// in the API changed, so no watch would.
	wake chan event.TypedGenericEvent[*kubevirtv1.VirtualMachine]

	mu       sync.Mutex
	failures map[types.NamespacedName]Failure
	pools    map[string]*addressPool
	// leases keep a VM's address on a network across its VMIs.
	leases map[string]netip.Addr
	// failNext are the VMIs whose next migration fails, with the reason.
	failNext map[types.NamespacedName]string
	// targets are the nodes the migrations' target pods went to, by the
	// migration's uid: the stand-in runs no pods to keep them.
	targets map[types.UID]string
	// warned are the migrations already said to be unschedulable.
	warned map[types.UID]bool
	// backedOff are the migrations already said to be held in backoff.
	backedOff map[types.UID]bool
	// entered is when each migration running entered its phase.
	entered map[types.UID]phaseEntered
}

type addressPool struct {
	prefix netip.Prefix
	next   netip.Addr
}

// setupController registers the FakeVirtController with mgr.
func setupController(mgr ctrl.Manager, step time.Duration) (*FakeVirtController, error) {
	c := &FakeVirtController{
		client:    mgr.GetClient(),
		live:      mgr.GetAPIReader(),
		step:      step,
		failures:  map[types.NamespacedName]Failure{},
		pools:     map[string]*addressPool{},
		leases:    map[string]netip.Addr{},
		failNext:  map[types.NamespacedName]string{},
		targets:   map[types.UID]string{},
		warned:    map[types.UID]bool{},
		backedOff: map[types.UID]bool{},
		entered:   map[types.UID]phaseEntered{},
		wake:      make(chan event.TypedGenericEvent[*kubevirtv1.VirtualMachine], 64),
	}
	options := controller.Options{
		// Several test clusters may run in one process.
		SkipNameValidation: ptr(true),
		LogConstructor:     func(*reconcile.Request) logr.Logger { return logr.Discard() },
		// Come back quickly after a test stopped the API server.
		RateLimiter: workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](10*time.Millisecond, time.Second),
	}
	err := ctrl.NewControllerManagedBy(mgr).
		Named("fake-virt-controller").
		For(&kubevirtv1.VirtualMachine{}).
		Owns(&kubevirtv1.VirtualMachineInstance{}).
		WatchesRawSource(source.Channel(c.wake, &handler.TypedEnqueueRequestForObject[*kubevirtv1.VirtualMachine]{})).
		Watches(&cdiv1.DataVolume{}, handler.EnqueueRequestsFromMapFunc(c.vmsOfDataVolume)).
		WithOptions(options).
		Complete(c)
	if err != nil {
		return nil, errors.Wrap(err, "cannot set up the fake virt-controller")
	}
	err = ctrl.NewControllerManagedBy(mgr).
		Named("fake-virt-migration-controller").
		For(&kubevirtv1.VirtualMachineInstanceMigration{}).
		Watches(&kubevirtv1.VirtualMachineInstance{}, handler.EnqueueRequestsFromMapFunc(c.migrationsOf)).
		WithOptions(options).
		Complete(reconcile.Func(c.reconcileMigration))
	if err != nil {
		return nil, errors.Wrap(err, "cannot set up the fake virt-controller's migrations")
	}
	err = ctrl.NewControllerManagedBy(mgr).
		Named("fake-virt-workload-updater").
		For(&kubevirtv1.VirtualMachineInstance{}).
		Watches(&kubevirtv1.VirtualMachineInstanceMigration{}, handler.EnqueueRequestsFromMapFunc(vmisOfMigration)).
		WithOptions(options).
		Complete(reconcile.Func(c.reconcileWorkloadUpdate))
	if err != nil {
		return nil, errors.Wrap(err, "cannot set up the fake virt-controller's workload updater")
	}
	return c, c.setupSnapshots(mgr, options)
}

// Fail makes the VM named nn show f until Recover: its VMI (when f leaves
// one) never gets a node, and the VM's printableStatus and a condition say
// f.Status and f.Message, as KubeVirt shows ErrorUnschedulable,
// ErrImagePull, CrashLoopBackOff, DataVolumeError and the like.
func (c *FakeVirtController) Fail(nn types.NamespacedName, f Failure) {
	c.mu.Lock()
	c.failures[nn] = f
	c.mu.Unlock()
	c.wakeUp(nn)
}

// wakeUp queues a reconcile of the VM named nn.
func (c *FakeVirtController) wakeUp(nn types.NamespacedName) {
	vm := &kubevirtv1.VirtualMachine{}
	vm.Namespace, vm.Name = nn.Namespace, nn.Name
	c.wake <- event.TypedGenericEvent[*kubevirtv1.VirtualMachine]{Object: vm}
}

// Recover lifts a failure Fail forced.
func (c *FakeVirtController) Recover(nn types.NamespacedName) {
	c.mu.Lock()
	delete(c.failures, nn)
	c.mu.Unlock()
	c.wakeUp(nn)
}

func (c *FakeVirtController) failure(nn types.NamespacedName) (Failure, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	f, ok := c.failures[nn]
	return f, ok
}

// Crash makes the running VMI of the VM named nn fail, as a guest crash
// would; a VM that should run gets a new VMI.
func (c *FakeVirtController) Crash(ctx context.Context, nn types.NamespacedName) error {
	vmi := &kubevirtv1.VirtualMachineInstance{}
	if err := c.client.Get(ctx, nn, vmi); err != nil {
		return errors.Wrap(err, "cannot get the VMI to crash")
	}
	vmi.Status.Phase = kubevirtv1.Failed
	return errors.Wrap(c.client.Update(ctx, vmi), "cannot crash the VMI")
}

// Reconcile implements reconcile.Reconciler.
func (c *FakeVirtController) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	vm := &kubevirtv1.VirtualMachine{}
	if err := c.client.Get(ctx, req.NamespacedName, vm); kerrors.IsNotFound(err) {
		// The garbage collector's part: no kube-controller-manager runs here.
		return reconcile.Result{}, c.deleteVMI(ctx, req.NamespacedName)
	} else if err != nil {
		return reconcile.Result{}, err
	}
	// The VMI as the API server has it, not as the cache last saw it: a
	// VMI replaced for a restart has the old one's name, and a cache that
	// still held the old one would have its shape judged against the
	// template it never ran, and the VM marked RestartRequired until its
	// next VMI (virt-controller guards with its expectations).
	vmi := &kubevirtv1.VirtualMachineInstance{}
	if err := c.live.Get(ctx, req.NamespacedName, vmi); kerrors.IsNotFound(err) {
		vmi = nil
	} else if err != nil {
		return reconcile.Result{}, err
	}

	if vm.DeletionTimestamp != nil {
		if vmi != nil {
			return reconcile.Result{RequeueAfter: c.step}, c.deleteVMI(ctx, req.NamespacedName)
		}
		if controllerutil.RemoveFinalizer(vm, Finalizer) {
			return reconcile.Result{}, c.client.Update(ctx, vm)
		}
		return reconcile.Result{}, nil
	}
	if controllerutil.AddFinalizer(vm, Finalizer) {
		return reconcile.Result{}, c.client.Update(ctx, vm)
	}
	if wrote, err := c.syncInstancetype(ctx, vm); err != nil || wrote {
		return reconcile.Result{RequeueAfter: c.step}, err
	}
	if len(vm.Status.VolumeRequests) > 0 && vm.Spec.Template != nil {
		return reconcile.Result{RequeueAfter: c.step}, c.volumeRequests(ctx, vm, vmi)
	}

	switch strategy(vm) {
	case kubevirtv1.RunStrategyAlways, kubevirtv1.RunStrategyRerunOnFailure:
		return c.run(ctx, vm, vmi)
	case kubevirtv1.RunStrategyHalted:
		if err := c.cleanupRestartRequired(ctx, vm); err != nil {
			return reconcile.Result{}, err
		}
		if vmi != nil {
			return reconcile.Result{RequeueAfter: c.step}, errors.Join(
				c.deleteVMI(ctx, req.NamespacedName),
				c.setStatus(ctx, vm, kubevirtv1.VirtualMachineStatusStopping, vmi, nil))
		}
		printable, f, err := c.dataVolumeStatus(ctx, vm)
		if err != nil {
			return reconcile.Result{}, err
		}
		return reconcile.Result{}, c.setStatus(ctx, vm, cmp.Or(printable, kubevirtv1.VirtualMachineStatusStopped), nil, f)
	default:
		return reconcile.Result{}, nil
	}
}

func strategy(vm *kubevirtv1.VirtualMachine) kubevirtv1.VirtualMachineRunStrategy {
	switch {
	case vm.Spec.RunStrategy != nil:
		return *vm.Spec.RunStrategy
	case vm.Spec.Running != nil && *vm.Spec.Running: //nolint:staticcheck // older clients still set it
		return kubevirtv1.RunStrategyAlways
	default:
		return kubevirtv1.RunStrategyHalted
	}
}

// run drives a VM that should run one step towards Running. A VM with
// an instance type runs it expanded (see instancetype.go).
func (c *FakeVirtController) run(ctx context.Context, vm *kubevirtv1.VirtualMachine, vmi *kubevirtv1.VirtualMachineInstance) (reconcile.Result, error) {
	nn := types.NamespacedName{Namespace: vm.Namespace, Name: vm.Name}
	again := reconcile.Result{RequeueAfter: c.step}
	vm, err := c.expanded(ctx, vm)
	if err != nil {
		return again, err
	}
	switch {
	case vmi != nil && vmi.DeletionTimestamp != nil:
		return again, nil
	case vmi != nil && vmi.IsFinal():
		// virt-controller replaces a finished VMI of a VM that should run.
		return again, errors.Join(c.deleteVMI(ctx, nn), c.setStatus(ctx, vm, kubevirtv1.VirtualMachineStatusStarting, vmi, nil))
	}
	if f, ok := c.failure(nn); ok {
		return c.fail(ctx, vm, vmi, f)
	}
	if vmi == nil {
		if f, missing, err := c.missingClaim(ctx, vm); err != nil || missing {
			return again, errors.Join(err, c.setStatus(ctx, vm, f.Status, nil, &f))
		}
		revision, err := c.revision(ctx, vm)
		if err != nil {
			return again, err
		}
		// A new VMI runs the template as it is now.
		if err := c.cleanupRestartRequired(ctx, vm); err != nil {
			return again, err
		}
		vmi = newVMI(vm)
		vmi.Status.VirtualMachineRevisionName = revision
		if err := c.client.Create(ctx, vmi); err != nil && !kerrors.IsAlreadyExists(err) {
			return reconcile.Result{}, errors.Wrap(err, "cannot create the VMI")
		}
		printable, f, err := c.dataVolumeStatus(ctx, vm)
		return again, errors.Join(err, c.setStatus(ctx, vm, cmp.Or(printable, kubevirtv1.VirtualMachineStatusStarting), vmi, f))
	}

	switch vmi.Status.Phase {
	case kubevirtv1.VmPhaseUnset, kubevirtv1.Pending:
		ready, err := c.volumesReady(ctx, vmi)
		if err != nil {
			return again, err
		}
		if !ready {
			// virt-controller makes no pod for the VMI until its volumes
			// are populated.
			printable, f, err := c.dataVolumeStatus(ctx, vm)
			return again, errors.Join(err, c.setStatus(ctx, vm, cmp.Or(printable, kubevirtv1.VirtualMachineStatusStarting), vmi, f))
		}
		vmi.Status.Phase = kubevirtv1.Scheduling
	case kubevirtv1.Scheduling:
		node, err := c.schedule(ctx, vm.Name)
		if err != nil {
			return again, err
		}
		if node == "" {
			f := Failure{Status: kubevirtv1.VirtualMachineStatusUnschedulable, Message: "0/0 nodes are available: no schedulable Ready node"}
			return again, c.setStatus(ctx, vm, f.Status, vmi, &f)
		}
		vmi.Status.Phase, vmi.Status.NodeName = kubevirtv1.Scheduled, node
	case kubevirtv1.Scheduled:
		migratable, err := c.liveMigratable(ctx, vmi)
		if err != nil {
			return again, err
		}
		vmi.Status.Phase = kubevirtv1.Running
		vmi.Status.Interfaces = c.interfaces(vm, vmi)
		vmi.Status.VolumeStatus, _ = volumeStatus(vmi, true)
		vmi.Status.Conditions = []kubevirtv1.VirtualMachineInstanceCondition{{Type: kubevirtv1.VirtualMachineInstanceReady, Status: corev1.ConditionTrue}, migratable}
	case kubevirtv1.Running:
		if status, changed := volumeStatus(vmi, false); changed {
			vmi.Status.VolumeStatus = status
			if err := c.client.Update(ctx, vmi); err != nil {
				return reconcile.Result{}, errors.Wrap(err, "cannot update the VMI's volume status")
			}
			return again, nil
		}
		// A hot-plug completes with a migration (see workloadupdate.go).
		started, err := c.startedShape(ctx, vmi)
		if err != nil {
			return again, err
		}
		patched, err := hotplugShape(started, vm, vmi)
		if errors.Is(err, errHotplugBusy) {
			return again, nil
		}
		if patched {
			if err := c.client.Update(ctx, vmi); err != nil {
				return reconcile.Result{}, errors.Wrap(err, "cannot update the VMI's CPU or memory")
			}
			return again, nil
		}
		switch {
		case migrating(vmi):
			return reconcile.Result{}, c.setStatus(ctx, vm, kubevirtv1.VirtualMachineStatusMigrating, vmi, nil)
		case IsPaused(vmi):
			return reconcile.Result{}, c.setStatus(ctx, vm, kubevirtv1.VirtualMachineStatusPaused, vmi, nil)
		}
		return reconcile.Result{}, c.setStatus(ctx, vm, kubevirtv1.VirtualMachineStatusRunning, vmi, nil)
	}
	// KubeVirt serves VMIs without a status subresource.
	if err := c.client.Update(ctx, vmi); err != nil {
		return reconcile.Result{}, errors.Wrap(err, "cannot update the VMI")
	}
	return again, c.setStatus(ctx, vm, kubevirtv1.VirtualMachineStatusStarting, vmi, nil)
}

// fail shows f the way KubeVirt would: a VMI stuck unscheduled for a pod
// that cannot be placed or pulled, no VMI for a crash loop's back-off or a
// volume that is not there.
func (c *FakeVirtController) fail(ctx context.Context, vm *kubevirtv1.VirtualMachine, vmi *kubevirtv1.VirtualMachineInstance, f Failure) (reconcile.Result, error) {
	nn := types.NamespacedName{Namespace: vm.Namespace, Name: vm.Name}
	keepsVMI := f.Status == kubevirtv1.VirtualMachineStatusUnschedulable || f.Status == kubevirtv1.VirtualMachineStatusErrImagePull || f.Status == kubevirtv1.VirtualMachineStatusImagePullBackOff
	var err error
	switch {
	case keepsVMI && vmi == nil:
		vmi = newVMI(vm)
		vmi.Status.Phase = kubevirtv1.Scheduling
		err = c.client.Create(ctx, vmi)
	case keepsVMI && vmi.Status.NodeName != "":
		err = c.deleteVMI(ctx, nn)
		vmi = nil
	case !keepsVMI && vmi != nil:
		err = c.deleteVMI(ctx, nn)
		vmi = nil
	}
	if f.Status == kubevirtv1.VirtualMachineStatusCrashLoopBackOff {
		vm.Status.StartFailure = &kubevirtv1.VirtualMachineStartFailure{ConsecutiveFailCount: 3}
	}
	return reconcile.Result{RequeueAfter: c.step}, errors.Join(err, c.setStatus(ctx, vm, f.Status, vmi, &f))
}

// missingClaim reports ErrorPvcNotFound when a PVC the VM names, as a
// persistentVolumeClaim or a dataVolume, is absent.
func (c *FakeVirtController) missingClaim(ctx context.Context, vm *kubevirtv1.VirtualMachine) (Failure, bool, error) {
	for _, v := range vm.Spec.Template.Spec.Volumes {
		name := claimName(v)
		if name == "" {
			continue
		}
		err := c.client.Get(ctx, types.NamespacedName{Namespace: vm.Namespace, Name: name}, &corev1.PersistentVolumeClaim{})
		if kerrors.IsNotFound(err) {
			return Failure{Status: kubevirtv1.VirtualMachineStatusPvcNotFound, Message: fmt.Sprintf("PVC %s/%s does not exist", vm.Namespace, name)}, true, nil
		}
		if err != nil {
			return Failure{}, false, errors.Wrap(err, "cannot get a PVC")
		}
	}
	return Failure{}, false, nil
}

// claimName is the PVC a volume is (KubeVirt's PVCNameFromVirtVolume): a
// dataVolume's is the DataVolume's own name. Empty for any other volume.
func claimName(v kubevirtv1.Volume) string {
	switch {
	case v.PersistentVolumeClaim != nil:
		return v.PersistentVolumeClaim.ClaimName
	case v.DataVolume != nil:
		return v.DataVolume.Name
	}
	return ""
}

// dataVolume reads the DataVolume named name in namespace; nil when there
// is none.
func (c *FakeVirtController) dataVolume(ctx context.Context, namespace, name string) (*cdiv1.DataVolume, error) {
	dv := &cdiv1.DataVolume{}
	switch err := c.client.Get(ctx, types.NamespacedName{Namespace: namespace, Name: name}, dv); {
	case kerrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, errors.Wrap(err, "cannot get a DataVolume")
	}
	return dv, nil
}

// dataVolumeStatus is the printable status the VM's dataVolumes give it, as
// virt-controller's isVirtualMachineStatusDataVolumeError and
// isVirtualMachineStatusProvisioning (HasDataVolumeErrors,
// HasDataVolumeProvisioning) decide it: DataVolumeError, with the failure
// that explains it, else Provisioning, else none.
func (c *FakeVirtController) dataVolumeStatus(ctx context.Context, vm *kubevirtv1.VirtualMachine) (kubevirtv1.VirtualMachinePrintableStatus, *Failure, error) {
	provisioning := false
	for _, v := range vm.Spec.Template.Spec.Volumes {
		if v.DataVolume == nil {
			continue
		}
		dv, err := c.dataVolume(ctx, vm.Namespace, v.DataVolume.Name)
		if err != nil {
			return "", nil, err
		}
		if dv == nil {
			continue
		}
		running := findDataVolumeCondition(dv, cdiv1.DataVolumeRunning)
		if dv.Status.Phase == cdiv1.Failed || (running != nil && running.Status == corev1.ConditionFalse && (running.Reason == "Error" || running.Reason == "ImagePullFailed")) {
			// The VM's condition is the VMI's DataVolumesReady, which
			// virt-controller aggregates over the VMI's DataVolumes.
			return kubevirtv1.VirtualMachineStatusDataVolumeError, &Failure{Status: kubevirtv1.VirtualMachineStatusDataVolumeError, Message: "Not all of the VMI's DVs are ready"}, nil
		}
		if dv.Status.Phase == cdiv1.Succeeded || dv.Status.Phase == cdiv1.PendingPopulation {
			continue
		}
		bound := findDataVolumeCondition(dv, cdiv1.DataVolumeBound)
		if (bound != nil && bound.Status == corev1.ConditionTrue) || dv.Status.Phase != cdiv1.WaitForFirstConsumer {
			provisioning = true
		}
	}
	if provisioning {
		return kubevirtv1.VirtualMachineStatusProvisioning, nil, nil
	}
	return "", nil, nil
}

func findDataVolumeCondition(dv *cdiv1.DataVolume, t cdiv1.DataVolumeConditionType) *cdiv1.DataVolumeCondition {
	for i := range dv.Status.Conditions {
		if dv.Status.Conditions[i].Type == t {
			return &dv.Status.Conditions[i]
		}
	}
	return nil
}

// volumesReady is whether every PVC the VMI uses is there and populated
// (KubeVirt's VolumeReadyToAttachToNode): a PVC a DataVolume controls is
// once that DataVolume has Succeeded or waits for its population, one no
// DataVolume controls always is.
func (c *FakeVirtController) volumesReady(ctx context.Context, vmi *kubevirtv1.VirtualMachineInstance) (bool, error) {
	for _, v := range vmi.Spec.Volumes {
		name := claimName(v)
		if name == "" {
			continue
		}
		pvc := &corev1.PersistentVolumeClaim{}
		switch err := c.client.Get(ctx, types.NamespacedName{Namespace: vmi.Namespace, Name: name}, pvc); {
		case kerrors.IsNotFound(err):
			return false, nil
		case err != nil:
			return false, errors.Wrap(err, "cannot get a PVC")
		}
		ready, err := cdiv1.IsSucceededOrPendingPopulation(pvc, func(name, namespace string) (*cdiv1.DataVolume, error) {
			dv, err := c.dataVolume(ctx, namespace, name)
			if err == nil && dv == nil {
				err = errors.Errorf("unable to find datavolume %s/%s", namespace, name)
			}
			return dv, err
		})
		if err != nil || !ready {
			return false, nil
		}
	}
	return true, nil
}

// vmsOfDataVolume are the VMs of the DataVolume's namespace with a volume
// that is it.
func (c *FakeVirtController) vmsOfDataVolume(ctx context.Context, o client.Object) []reconcile.Request {
	vms := &kubevirtv1.VirtualMachineList{}
	if err := c.client.List(ctx, vms, client.InNamespace(o.GetNamespace())); err != nil {
		return nil
	}
	var out []reconcile.Request
	for _, vm := range vms.Items {
		if vm.Spec.Template == nil {
			continue
		}
		for _, v := range vm.Spec.Template.Spec.Volumes {
			if v.DataVolume != nil && v.DataVolume.Name == o.GetName() {
				out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: vm.Namespace, Name: vm.Name}})
				break
			}
		}
	}
	return out
}

// failureCondition is the condition KubeVirt explains a printable status with.
func failureCondition(f Failure) kubevirtv1.VirtualMachineCondition {
	cond := kubevirtv1.VirtualMachineCondition{Type: kubevirtv1.VirtualMachineFailure, Status: corev1.ConditionTrue, Reason: string(f.Status), Message: f.Message}
	switch f.Status {
	case kubevirtv1.VirtualMachineStatusUnschedulable:
		cond.Type, cond.Status, cond.Reason = kubevirtv1.VirtualMachineConditionType(corev1.PodScheduled), corev1.ConditionFalse, corev1.PodReasonUnschedulable
	case kubevirtv1.VirtualMachineStatusDataVolumeError:
		cond.Type, cond.Status, cond.Reason = kubevirtv1.VirtualMachineConditionType(kubevirtv1.VirtualMachineInstanceDataVolumesReady), corev1.ConditionFalse, kubevirtv1.VirtualMachineInstanceReasonNotAllDVsReady
	}
	return cond
}

// setStatus writes the VM's status as virt-controller derives it.
func (c *FakeVirtController) setStatus(ctx context.Context, vm *kubevirtv1.VirtualMachine, printable kubevirtv1.VirtualMachinePrintableStatus, vmi *kubevirtv1.VirtualMachineInstance, f *Failure) error {
	want := vm.Status.DeepCopy()
	want.PrintableStatus = printable
	want.Created = vmi != nil
	want.Ready = vmi != nil && vmi.Status.Phase == kubevirtv1.Running
	want.RunStrategy = strategy(vm)
	want.ObservedGeneration = vm.Generation
	ready := kubevirtv1.VirtualMachineCondition{Type: kubevirtv1.VirtualMachineReady, Status: corev1.ConditionFalse}
	if want.Ready {
		ready.Status = corev1.ConditionTrue
	}
	want.Conditions = []kubevirtv1.VirtualMachineCondition{ready}
	if restart := findCondition(vm.Status.Conditions, kubevirtv1.VirtualMachineRestartRequired); restart != nil && vmi != nil {
		// Until the next VMI (see hotplugShape).
		want.Conditions = append(want.Conditions, *restart)
	}
	if f != nil {
		want.Conditions = append(want.Conditions, failureCondition(*f))
	} else {
		want.StartFailure = nil
	}
	for i := range want.Conditions {
		// Keep the transition time of unchanged conditions, so an unchanged
		// status is not written again.
		if old := findCondition(vm.Status.Conditions, want.Conditions[i].Type); old != nil && old.Status == want.Conditions[i].Status {
			want.Conditions[i].LastTransitionTime = old.LastTransitionTime
		} else {
			want.Conditions[i].LastTransitionTime = metav1.Now()
		}
	}
	if equalStatus(vm.Status, *want) {
		return nil
	}
	vm.Status = *want
	return errors.Wrap(c.client.Status().Update(ctx, vm), "cannot update the VM's status")
}

func findCondition(cs []kubevirtv1.VirtualMachineCondition, t kubevirtv1.VirtualMachineConditionType) *kubevirtv1.VirtualMachineCondition {
	for i := range cs {
		if cs[i].Type == t {
			return &cs[i]
		}
	}
	return nil
}

func equalStatus(a, b kubevirtv1.VirtualMachineStatus) bool {
	return a.PrintableStatus == b.PrintableStatus && a.Created == b.Created && a.Ready == b.Ready &&
		a.RunStrategy == b.RunStrategy && a.ObservedGeneration == b.ObservedGeneration &&
		slices.EqualFunc(a.Conditions, b.Conditions, func(x, y kubevirtv1.VirtualMachineCondition) bool {
			return x.Type == y.Type && x.Status == y.Status && x.Reason == y.Reason && x.Message == y.Message
		}) && (a.StartFailure == nil) == (b.StartFailure == nil)
}

func (c *FakeVirtController) deleteVMI(ctx context.Context, nn types.NamespacedName) error {
	vmi := &kubevirtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: nn.Namespace, Name: nn.Name}}
	return errors.Wrap(client.IgnoreNotFound(c.client.Delete(ctx, vmi)), "cannot delete the VMI")
}

// newVMI is the VMI virt-controller makes from a VM's template.
func newVMI(vm *kubevirtv1.VirtualMachine) *kubevirtv1.VirtualMachineInstance {
	t := vm.Spec.Template
	vmi := &kubevirtv1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:       vm.Namespace,
			Name:            vm.Name,
			Labels:          t.ObjectMeta.Labels,
			Annotations:     t.ObjectMeta.Annotations,
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(vm, kubevirtv1.VirtualMachineGroupVersionKind)},
		},
		Spec: *t.Spec.DeepCopy(),
	}
	vmi.Status.Phase = kubevirtv1.Pending
	defaultHotplug(vmi)
	return vmi
}

// schedule picks a schedulable Ready node for the VM, the same one for the
// same name while the nodes stay the same.
func (c *FakeVirtController) schedule(ctx context.Context, vm string) (string, error) {
	nodes := &corev1.NodeList{}
	if err := c.client.List(ctx, nodes); err != nil {
		return "", errors.Wrap(err, "cannot list nodes")
	}
	var names []string
	for _, n := range nodes.Items {
		if Schedulable(n) {
			names = append(names, n.Name)
		}
	}
	if len(names) == 0 {
		return "", nil
	}
	slices.Sort(names)
	h := fnv.New32a()
	_, _ = h.Write([]byte(vm))
	return names[int(h.Sum32())%len(names)], nil
}

// Schedulable reports whether KubeVirt could place a VMI on n: it is not
// cordoned and is Ready.
func Schedulable(n corev1.Node) bool {
	if n.Spec.Unschedulable {
		return false
	}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// interfaces are what virt-handler reports for a running VMI: one per
// network, with the MAC its interface asks for (else one of the stand-in's
// making) and, for a Multus network, the guest agent's address: the static
// one the VMI's cloud-init network data gives that MAC, as the guest would
// configure it, else a lease from the stand-in's pool.
func (c *FakeVirtController) interfaces(vm *kubevirtv1.VirtualMachine, vmi *kubevirtv1.VirtualMachineInstance) []kubevirtv1.VirtualMachineInstanceNetworkInterface {
	asked := map[string]string{}
	for _, i := range vmi.Spec.Domain.Devices.Interfaces {
		asked[i.Name] = i.MacAddress
	}
	static := staticAddresses(vmi)
	out := make([]kubevirtv1.VirtualMachineInstanceNetworkInterface, 0, len(vmi.Spec.Networks))
	for i, n := range vmi.Spec.Networks {
		mac := asked[n.Name]
		if mac == "" {
			sum := sha256.Sum256([]byte(string(vmi.UID) + n.Name))
			mac = fmt.Sprintf("02:%02x:%02x:%02x:%02x:%02x", sum[0], sum[1], sum[2], sum[3], sum[4])
		}
		mac = canonicalMAC(mac)
		iface := kubevirtv1.VirtualMachineInstanceNetworkInterface{
			Name:          n.Name,
			MAC:           mac,
			InterfaceName: fmt.Sprintf("eth%d", i),
			InfoSource:    InfoSource,
		}
		if s, ok := static[mac]; ok {
			if s.name != "" {
				iface.InterfaceName = s.name
			}
			iface.IP, iface.IPs = s.ips[0], s.ips
			out = append(out, iface)
			continue
		}
		network := "pod"
		if n.Multus != nil {
			network = n.Multus.NetworkName
		}
		ip := c.lease(vm.Namespace+"/"+vm.Name, network).String()
		iface.IP, iface.IPs = ip, []string{ip}
		out = append(out, iface)
	}
	return out
}

// canonicalMAC is mac as libvirt and so virt-handler report it: lower case,
// colon-separated. One that does not parse is left as it is.
func canonicalMAC(mac string) string {
	hw, err := net.ParseMAC(mac)
	if err != nil {
		return mac
	}
	return hw.String()
}

// networkData is what the stand-in reads of cloud-init's network
// configuration version 2: the interfaces matched by MAC, their names and
// their static addresses. Other versions and keys are ignored; interfaces
// they configure get a lease, as DHCP would give them.
type networkData struct {
	Version   int `json:"version"`
	Ethernets map[string]struct {
		Match struct {
			MACAddress string `json:"macaddress"`
		} `json:"match"`
		SetName   string   `json:"set-name"`
		Addresses []string `json:"addresses"`
	} `json:"ethernets"`
}

// staticInterface is what a guest configured from network data reports
// through its agent: its name and addresses, without prefix lengths.
type staticInterface struct {
	name string
	ips  []string
}

// staticAddresses are the interfaces the VMI's cloud-init network data
// (cloudInitNoCloud or cloudInitConfigDrive, inline or base64) gives static
// addresses, by canonical MAC. Network data the stand-in cannot read
// configures nothing, as a guest's cloud-init would fall back to DHCP.
func staticAddresses(vmi *kubevirtv1.VirtualMachineInstance) map[string]staticInterface {
	out := map[string]staticInterface{}
	for _, v := range vmi.Spec.Volumes {
		var inline, encoded string
		switch {
		case v.CloudInitNoCloud != nil:
			inline, encoded = v.CloudInitNoCloud.NetworkData, v.CloudInitNoCloud.NetworkDataBase64
		case v.CloudInitConfigDrive != nil:
			inline, encoded = v.CloudInitConfigDrive.NetworkData, v.CloudInitConfigDrive.NetworkDataBase64
		default:
			continue
		}
		raw := []byte(inline)
		if encoded != "" {
			b, err := base64.StdEncoding.DecodeString(encoded)
			if err != nil {
				continue
			}
			raw = b
		}
		var nd networkData
		if len(raw) == 0 || yaml.Unmarshal(raw, &nd) != nil || nd.Version != 2 {
			continue
		}
		for _, e := range nd.Ethernets {
			var ips []string
			for _, a := range e.Addresses {
				if p, err := netip.ParsePrefix(a); err == nil {
					ips = append(ips, p.Addr().String())
				} else if ip, err := netip.ParseAddr(a); err == nil {
					ips = append(ips, ip.String())
				}
			}
			if e.Match.MACAddress != "" && len(ips) > 0 {
				out[canonicalMAC(e.Match.MACAddress)] = staticInterface{name: e.SetName, ips: ips}
			}
		}
	}
	return out
}

// lease is the VM's address on network, the same every time it is asked.
// Each network gets a /24 of 10.200.0.0/16 of its own, in order of first use.
func (c *FakeVirtController) lease(vm, network string) netip.Addr {
	c.mu.Lock()
	defer c.mu.Unlock()
	key := vm + " " + network
	if a, ok := c.leases[key]; ok {
		return a
	}
	p, ok := c.pools[network]
	if !ok {
		prefix := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 200, byte(len(c.pools)), 0}), 24)
		p = &addressPool{prefix: prefix, next: prefix.Addr().Next().Next()}
		c.pools[network] = p
	}
	a := p.next
	p.next = a.Next()
	c.leases[key] = a
	return a
}

func ptr[T any](v T) *T { return &v }
