package chaos

import (
	"context"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/bench/workload"
)

// The chaos run's workload (bench/workload) lives in its own namespace.
const namespace = "chaos"

var fleet = workload.Fleet{Namespace: namespace, Network: "chaos-net", CIDR: "10.30.0.0/16", Creators: 16}

// sharedPool is the stack's shared storage pool, where the HA VMs'
// Volumes are.
const sharedPool = "vfshared"

// newVM is the i-th VM, booting from the i-th Volume. A VM that keeps its
// guest has management policies without Delete: deleting it orphans the
// guest, and the next VM of its name adopts it. An HA VM (its Volume in
// the shared pool) is restarted on another node when its node is lost.
func newVM(i int, keep, ha bool) *v1alpha1.VirtualMachine {
	vm := fleet.VM(workload.VMName(i), workload.VolumeName(i))
	if keep {
		vm.SetManagementPolicies(xpv2.ManagementPolicies{xpv2.ManagementActionObserve, xpv2.ManagementActionCreate, xpv2.ManagementActionUpdate, xpv2.ManagementActionLateInitialize})
	}
	if ha {
		restart := v1alpha1.AvailabilityRestart
		vm.Spec.ForProvider.Availability = &restart
	}
	return vm
}

// prepare is fleet.Prepare for vms Volumes of which the last ha are in the
// shared pool, for the HA VMs. It does not wait for those: the VMs' first
// convergence, before any fault, does.
func prepare(ctx context.Context, kube client.Client, vms, ha int) error {
	if err := fleet.Prepare(ctx, kube, vms-ha); err != nil {
		return err
	}
	return workload.Parallel(ctx, ha, fleet.Creators, func(ctx context.Context, i int) error {
		v := &v1alpha1.Volume{
			ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: workload.VolumeName(vms - ha + i)},
			Spec: v1alpha1.VolumeSpec{ForProvider: v1alpha1.VolumeParameters{
				Size: resource.MustParse(workload.VolumeSize), StoragePool: sharedPool,
			}},
		}
		return errors.Wrapf(kube.Create(ctx, v), "cannot create Volume %s", v.Name)
	})
}

// slot is one VM name the churn owns: what the churn last asked for.
type slot struct {
	i        int
	exists   bool
	running  bool
	deleting bool
	// keep is set when the VM's deletion orphans its guest.
	keep bool
	// ha is set on the slots whose VMs are restarted elsewhere when their
	// node is lost; it never changes.
	ha bool
	// frozen holds the churn off the slot while a node fault measures its
	// VM's restart elsewhere.
	frozen atomic.Bool
}

// churn creates, stops, starts and deletes the VMs at a steady rate. Each
// slot belongs to one worker, so no two requests for a VM race; the
// expected state is therefore exact. pause holds the churn between
// requests so the fleet can converge on a fixed spec.
type churn struct {
	kube    client.Client
	slots   []*slot
	workers int
	every   time.Duration // per worker
	gate    sync.RWMutex
	ops     atomic.Int64
	errs    atomic.Int64
	kinds   [5]atomic.Int64 // create, stop, start, delete, orphan
}

const (
	opCreate = iota
	opStop
	opStart
	opDelete
	// opOrphan deletes a VM that keeps its guest; the slot's next create
	// adopts it.
	opOrphan
)

// newChurn churns vms VMs, the last ha of them HA.
func newChurn(kube client.Client, vms, ha, workers int, opsPerSecond float64) *churn {
	c := &churn{kube: kube, workers: workers, every: time.Duration(float64(workers) / opsPerSecond * float64(time.Second))}
	for i := range vms {
		c.slots = append(c.slots, &slot{i: i, ha: i >= vms-ha})
	}
	return c
}

// createAll creates every slot's VM, running; every third keeps its guest.
func (c *churn) createAll(ctx context.Context) error {
	return workload.Parallel(ctx, len(c.slots), fleet.Creators, func(ctx context.Context, i int) error {
		// Every third VM keeps its guest, so the churn orphans and adopts.
		keep := i%3 == 0
		if err := c.kube.Create(ctx, newVM(i, keep, c.slots[i].ha)); err != nil {
			return errors.Wrapf(err, "cannot create VirtualMachine %s", workload.VMName(i))
		}
		c.slots[i].exists, c.slots[i].running, c.slots[i].keep = true, true, keep
		return nil
	})
}

// run churns until ctx ends.
func (c *churn) run(ctx context.Context) {
	var wg sync.WaitGroup
	for w := range c.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
			var mine []*slot
			for i := w; i < len(c.slots); i += c.workers {
				mine = append(mine, c.slots[i])
			}
			tick := time.NewTicker(c.every)
			defer tick.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				c.gate.RLock()
				c.step(ctx, rng, mine[rng.IntN(len(mine))])
				c.gate.RUnlock()
			}
		}()
	}
	wg.Wait()
}

func (c *churn) pause()  { c.gate.Lock() }
func (c *churn) resume() { c.gate.Unlock() }

// want is the set of VM names that should exist; call it paused.
func (c *churn) want() map[string]bool {
	out := map[string]bool{}
	for _, s := range c.slots {
		out[workload.VMName(s.i)] = s.exists && !s.deleting
	}
	return out
}

// step makes one request for s, chosen from its state: a VM that is absent
// is created, a deleted one is waited for, an existing one is stopped,
// started or (one time in eight) deleted.
func (c *churn) step(ctx context.Context, rng *rand.Rand, s *slot) {
	if s.frozen.Load() {
		return
	}
	key := types.NamespacedName{Namespace: namespace, Name: workload.VMName(s.i)}
	var err error
	op := -1
	switch {
	case s.deleting:
		// Recreate only once the hub finalized the old one, then at once,
		// so the fleet stays near its size.
		err = c.kube.Get(ctx, key, &v1alpha1.VirtualMachine{})
		if err == nil {
			return
		}
		if !kerrors.IsNotFound(err) {
			break
		}
		s.exists, s.deleting = false, false
		fallthrough
	case !s.exists:
		op = opCreate
		keep := rng.IntN(3) == 0
		if err = c.kube.Create(ctx, newVM(s.i, keep, s.ha)); err == nil {
			s.exists, s.running, s.keep = true, true, keep
		}
	case rng.IntN(8) == 0:
		op = opDelete
		if s.keep {
			op = opOrphan
		}
		vm := &v1alpha1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: key.Name}}
		if err = c.kube.Delete(ctx, vm); err == nil {
			s.deleting = true
		}
	default:
		op = opStart
		if s.running {
			op = opStop
		}
		// A merge patch of the power state alone, without reading the VM.
		before := &v1alpha1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: key.Name}}
		before.Spec.ForProvider.Running = ptr.To(s.running)
		vm := before.DeepCopy()
		vm.Spec.ForProvider.Running = ptr.To(!s.running)
		if err = c.kube.Patch(ctx, vm, client.MergeFrom(before)); err == nil {
			s.running = !s.running
		}
	}
	if op >= 0 && err == nil {
		c.ops.Add(1)
		c.kinds[op].Add(1)
		return
	}
	if ctx.Err() != nil {
		return
	}
	// The request may have happened anyway: learn the truth from the API.
	c.errs.Add(1)
	c.resync(ctx, s)
}

func (c *churn) resync(ctx context.Context, s *slot) {
	vm := &v1alpha1.VirtualMachine{}
	err := c.kube.Get(ctx, types.NamespacedName{Namespace: namespace, Name: workload.VMName(s.i)}, vm)
	switch {
	case kerrors.IsNotFound(err):
		s.exists, s.deleting = false, false
	case err == nil:
		s.exists, s.deleting = true, vm.DeletionTimestamp != nil
		s.running = vm.Spec.ForProvider.Running == nil || *vm.Spec.ForProvider.Running
		s.keep = !slices.Contains(vm.GetManagementPolicies(), xpv2.ManagementActionDelete) && !slices.Contains(vm.GetManagementPolicies(), xpv2.ManagementActionAll)
	}
}
