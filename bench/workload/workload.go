// Package workload is the fleet make bench and make chaos drive: small VMs
// in one namespace, each booting from a Volume of its own (a Volume binds
// its VMs to one node, so a shared one would pin every VM to the same node),
// all joining one VirtualNetwork.
package workload

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
)

// The shape of every VM and Volume. The Volumes are small: the test
// driver's pool holds 100 GiB per node.
const (
	VCPU       = 1
	Memory     = "64Mi"
	VolumeSize = "64Mi"
)

// VMName and VolumeName name the i-th VM and its boot Volume.
func VMName(i int) string     { return fmt.Sprintf("vm-%04d", i) }
func VolumeName(i int) string { return fmt.Sprintf("vm-%04d-root", i) }

// Fleet is where the workload lives.
type Fleet struct {
	Namespace string
	Network   string
	CIDR      string
	// Creators is how many creates are in flight at once.
	Creators int
}

// VM is a workload VM named name that boots from the Volume disk.
func (f Fleet) VM(name, disk string) *v1alpha1.VirtualMachine {
	return &v1alpha1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.Namespace, Name: name},
		Spec: v1alpha1.VirtualMachineSpec{ForProvider: v1alpha1.VirtualMachineParameters{
			Vcpu:            VCPU,
			Memory:          resource.MustParse(Memory),
			VirtualNetworks: []v1alpha1.LocalName{v1alpha1.LocalName(f.Network)},
			DiskAttachments: []v1alpha1.DiskAttachment{{Name: v1alpha1.LocalName(disk)}},
		}},
	}
}

// Prepare creates the namespace, the network and n Volumes, and waits until
// the hub has reconciled every Volume (Ready), so their writes are over
// before anything is measured. ctx bounds the wait.
func (f Fleet) Prepare(ctx context.Context, kube client.Client, n int) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: f.Namespace}}
	if err := kube.Create(ctx, ns); err != nil && !kerrors.IsAlreadyExists(err) {
		return errors.Wrapf(err, "cannot create namespace %s", f.Namespace)
	}
	net := &v1alpha1.VirtualNetwork{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.Namespace, Name: f.Network},
		Spec:       v1alpha1.VirtualNetworkSpec{ForProvider: v1alpha1.VirtualNetworkParameters{Mode: v1alpha1.NetworkModeNAT, CIDR: f.CIDR}},
	}
	if err := kube.Create(ctx, net); err != nil {
		return errors.Wrapf(err, "cannot create VirtualNetwork %s", f.Network)
	}
	err := Parallel(ctx, n, f.Creators, func(ctx context.Context, i int) error {
		v := &v1alpha1.Volume{
			ObjectMeta: metav1.ObjectMeta{Namespace: f.Namespace, Name: VolumeName(i)},
			Spec:       v1alpha1.VolumeSpec{ForProvider: v1alpha1.VolumeParameters{Size: resource.MustParse(VolumeSize)}},
		}
		return errors.Wrapf(kube.Create(ctx, v), "cannot create Volume %s", v.Name)
	})
	if err != nil {
		return err
	}
	// Each look lists every Volume: look less often the more there are,
	// or the looking itself would load the API server the hub works on.
	every := max(500*time.Millisecond, time.Duration(n)*time.Millisecond/2)
	return WaitFor(ctx, every, func() (bool, error) {
		l := &v1alpha1.VolumeList{}
		if err := kube.List(ctx, l, client.InNamespace(f.Namespace)); err != nil {
			return false, errors.Wrap(err, "cannot list Volumes")
		}
		ready := 0
		for i := range l.Items {
			if l.Items[i].GetCondition(xpv2.TypeReady).Status == corev1.ConditionTrue {
				ready++
			}
		}
		return ready == n, nil
	})
}

// Parallel runs do(i) for i in [0, n) on at most workers goroutines and
// returns the first error; the first error stops the others.
func Parallel(ctx context.Context, n, workers int, do func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	next := make(chan int)
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for range min(workers, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := do(ctx, i); err != nil {
					errs <- err
					cancel()
					return
				}
			}
		}()
	}
feed:
	for i := range n {
		select {
		case next <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	select {
	case err := <-errs:
		return err
	default:
		return ctx.Err()
	}
}

// WaitFor polls ok until it holds or ctx ends. It is for setup only; the
// measurements come from watches.
func WaitFor(ctx context.Context, every time.Duration, ok func() (bool, error)) error {
	for {
		done, err := ok()
		if err != nil || done {
			return err
		}
		select {
		case <-ctx.Done():
			return errors.Wrap(ctx.Err(), "gave up waiting")
		case <-time.After(every):
		}
	}
}
