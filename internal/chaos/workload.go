package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
)

// The workload is the benchmark's (internal/benchmark): every VM boots from
// a Volume of its own, so placement spreads them, and all join one network.
const (
	namespace   = "chaos"
	networkName = "chaos-net"
	networkCIDR = "10.30.0.0/16"
	vmMemory    = "64Mi"
	volumeSize  = "64Mi"
)

func vmName(i int) string     { return fmt.Sprintf("vm-%04d", i) }
func volumeName(i int) string { return fmt.Sprintf("vm-%04d-root", i) }

func newVM(i int) *v1alpha1.VirtualMachine {
	return &v1alpha1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: vmName(i)},
		Spec: v1alpha1.VirtualMachineSpec{ForProvider: v1alpha1.VirtualMachineParameters{
			Vcpu:            1,
			Memory:          resource.MustParse(vmMemory),
			VirtualNetworks: []v1alpha1.LocalName{networkName},
			DiskAttachments: []v1alpha1.DiskAttachment{{Name: v1alpha1.LocalName(volumeName(i))}},
		}},
	}
}

// prepare creates the namespace, the network and one Volume per VM, and
// waits until every Volume is Ready.
func prepare(ctx context.Context, kube client.Client, n int) error {
	if err := kube.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}); err != nil && !kerrors.IsAlreadyExists(err) {
		return errors.Wrap(err, "cannot create the chaos namespace")
	}
	net := &v1alpha1.VirtualNetwork{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: networkName},
		Spec:       v1alpha1.VirtualNetworkSpec{ForProvider: v1alpha1.VirtualNetworkParameters{Mode: v1alpha1.NetworkModeNAT, CIDR: networkCIDR}},
	}
	if err := kube.Create(ctx, net); err != nil {
		return errors.Wrap(err, "cannot create the chaos network")
	}
	if err := parallel(ctx, n, 16, func(ctx context.Context, i int) error {
		v := &v1alpha1.Volume{
			ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: volumeName(i)},
			Spec:       v1alpha1.VolumeSpec{ForProvider: v1alpha1.VolumeParameters{Size: resource.MustParse(volumeSize)}},
		}
		return errors.Wrapf(kube.Create(ctx, v), "cannot create Volume %s", v.Name)
	}); err != nil {
		return err
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		l := &v1alpha1.VolumeList{}
		if err := kube.List(ctx, l, client.InNamespace(namespace)); err != nil {
			return errors.Wrap(err, "cannot list Volumes")
		}
		ready := 0
		for i := range l.Items {
			if l.Items[i].GetCondition(xpv2.TypeReady).Status == corev1.ConditionTrue {
				ready++
			}
		}
		if ready == n {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.Errorf("only %d of %d Volumes Ready after 2 minutes", ready, n)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// parallel runs do(i) for i in [0, n) on at most workers goroutines and
// returns the first error.
func parallel(ctx context.Context, n, workers int, do func(ctx context.Context, i int) error) error {
	var (
		wg    sync.WaitGroup
		next  atomic.Int64
		first error
		once  sync.Once
	)
	for range min(workers, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n || ctx.Err() != nil {
					return
				}
				if err := do(ctx, i); err != nil {
					once.Do(func() { first = err })
					return
				}
			}
		}()
	}
	wg.Wait()
	if first != nil {
		return first
	}
	return ctx.Err()
}

// slot is one VM name the churn owns: what the churn last asked for.
type slot struct {
	i        int
	exists   bool
	running  bool
	deleting bool
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
	kinds   [4]atomic.Int64 // create, stop, start, delete
}

const (
	opCreate = iota
	opStop
	opStart
	opDelete
)

func newChurn(kube client.Client, vms, workers int, opsPerSecond float64) *churn {
	c := &churn{kube: kube, workers: workers, every: time.Duration(float64(workers) / opsPerSecond * float64(time.Second))}
	for i := range vms {
		c.slots = append(c.slots, &slot{i: i})
	}
	return c
}

// createAll creates every slot's VM, running.
func (c *churn) createAll(ctx context.Context) error {
	return parallel(ctx, len(c.slots), 16, func(ctx context.Context, i int) error {
		if err := c.kube.Create(ctx, newVM(i)); err != nil {
			return errors.Wrapf(err, "cannot create VirtualMachine %s", vmName(i))
		}
		c.slots[i].exists, c.slots[i].running = true, true
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
		out[vmName(s.i)] = s.exists && !s.deleting
	}
	return out
}

// step makes one request for s, chosen from its state: a VM that is absent
// is created, a deleted one is waited for, an existing one is stopped,
// started or (one time in eight) deleted.
func (c *churn) step(ctx context.Context, rng *rand.Rand, s *slot) {
	key := types.NamespacedName{Namespace: namespace, Name: vmName(s.i)}
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
		if err = c.kube.Create(ctx, newVM(s.i)); err == nil {
			s.exists, s.running = true, true
		}
	case rng.IntN(8) == 0:
		op = opDelete
		vm := &v1alpha1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: key.Name}}
		if err = c.kube.Delete(ctx, vm); err == nil {
			s.deleting = true
		}
	default:
		op = opStart
		if s.running {
			op = opStop
		}
		patch := fmt.Sprintf(`{"spec":{"forProvider":{"running":%t}}}`, !s.running)
		vm := &v1alpha1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: key.Name}}
		if err = c.kube.Patch(ctx, vm, client.RawPatch(types.MergePatchType, []byte(patch))); err == nil {
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
	err := c.kube.Get(ctx, types.NamespacedName{Namespace: namespace, Name: vmName(s.i)}, vm)
	switch {
	case kerrors.IsNotFound(err):
		s.exists, s.deleting = false, false
	case err == nil:
		s.exists, s.deleting = true, vm.DeletionTimestamp != nil
		s.running = vm.Spec.ForProvider.Running == nil || *vm.Spec.ForProvider.Running
	}
}
