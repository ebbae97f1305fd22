package benchmark

import (
	"context"
	"fmt"
	"sync"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/bench/workload"
	"github.com/virtfleet/virtfleet/internal/testing/libvirttest"
)

// Limit is a floor virtfleet's rate is compared with: how fast the same
// work goes with nothing of virtfleet in the way.
type Limit struct {
	VMs          int     `json:"vms"`
	Seconds      float64 `json:"seconds"`
	VMsPerSecond float64 `json:"vmsPerSecond"`
	// WritesPerVM is, for the control plane's limit, how many API writes
	// were made per VM.
	WritesPerVM int `json:"writesPerVM,omitempty"`
	// Workers is how many writers or connections worked at once.
	Workers int `json:"workers"`
	// CPU is the machine's CPU over the measurement, for the control
	// plane's limit: what the same number of VMs costs the machine with
	// nothing of virtfleet running.
	CPU *CPUShare `json:"cpu,omitempty"`
}

func limit(vms, workers, writes int, d time.Duration) Limit {
	return Limit{VMs: vms, Seconds: d.Seconds(), VMsPerSecond: float64(vms) / d.Seconds(), WritesPerVM: writes, Workers: workers}
}

// rawLibvirt defines and starts n minimal domains, shaped like the
// benchmark's VMs, spread evenly over nodes' daemons: one go-libvirt
// connection and one goroutine per node, as each node has one agent. It is
// the floor of the data path: no NATS, no volumes, no seed ISO, no report.
//
// A daemon that is gone is started again, fresh, and named in restarted:
// libvirtd 9.0 now and then segfaults when a client with event callbacks
// disconnects, as the agents just did (dmesg: "libvirtd[...]: segfault ...
// in libvirt.so.0.9000.0").
func rawLibvirt(ctx context.Context, nodes []*libvirttest.Node, n int) (_ Limit, restarted []string, _ error) {
	conns := make([]*golibvirt.Libvirt, len(nodes))
	for i, node := range nodes {
		l, err := node.Dial()
		if err != nil {
			if rerr := node.Restart(ctx); rerr != nil {
				return Limit{}, nil, errors.Wrapf(rerr, "cannot dial node %s (%v), nor start its daemon again", node.Name, err)
			}
			restarted = append(restarted, node.Name)
			if l, err = node.Dial(); err != nil {
				return Limit{}, nil, errors.Wrapf(err, "cannot dial node %s started again", node.Name)
			}
		}
		conns[i] = l
		defer l.Disconnect() //nolint:errcheck // the measurement is over
	}
	var wg sync.WaitGroup
	errs := make([]error, len(conns))
	start := time.Now()
	for c, l := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := c; i < n; i += len(conns) {
				if ctx.Err() != nil {
					errs[c] = ctx.Err()
					return
				}
				if err := defineAndStart(l, fmt.Sprintf("raw-%04d", i)); err != nil {
					errs[c] = errors.Wrapf(err, "node %s", nodes[c].Name)
					return
				}
			}
		}()
	}
	wg.Wait()
	d := time.Since(start)
	if err := errors.Join(errs...); err != nil {
		return Limit{}, nil, err
	}
	return limit(n, len(conns), 0, d), restarted, nil
}

func defineAndStart(l *golibvirt.Libvirt, name string) error {
	x, err := (&libvirtxml.Domain{
		Type:   "test",
		Name:   name,
		VCPU:   &libvirtxml.DomainVCPU{Value: workload.VCPU},
		Memory: &libvirtxml.DomainMemory{Value: 64, Unit: "MiB"},
		OS:     &libvirtxml.DomainOS{Type: &libvirtxml.DomainOSType{Type: "hvm"}},
	}).Marshal()
	if err != nil {
		return errors.Wrap(err, "cannot render the domain")
	}
	dom, err := l.DomainDefineXMLFlags(x, 0)
	if err != nil {
		return errors.Wrap(err, "cannot define the domain")
	}
	return errors.Wrap(l.DomainCreate(dom), "cannot start the domain")
}

// controlPlaneWriters is how many VMs the plain client writes at once. The
// hub reconciles up to 100 VMs at once; 64 writers already keep a 2-core
// API server saturated, so more would only add queueing.
const controlPlaneWriters = 64

// controlPlane is the API server's own limit for virtfleet's write pattern:
// a plain client, with no hub and no agent, creates n VirtualMachines and
// writes each writes-1 more times (status updates, as the hub's are),
// each VM's writes in order and controlPlaneWriters VMs at once. ns must
// hold no VMs a running hub would pick up.
func controlPlane(ctx context.Context, kube client.Client, ns string, n, writes int) (Limit, error) {
	writes = max(1, writes)
	phases := []v1alpha1.Phase{v1alpha1.PhasePending, v1alpha1.PhaseScheduled, v1alpha1.PhaseProvisioning, v1alpha1.PhaseStarting, v1alpha1.PhaseRunning}
	cpuBefore, err := snapshotCPU()
	if err != nil {
		return Limit{}, err
	}
	start := time.Now()
	f := fleet
	f.Namespace = ns
	err = workload.Parallel(ctx, n, controlPlaneWriters, func(ctx context.Context, i int) error {
		vm := f.VM(fmt.Sprintf("cp-%04d", i), workload.VolumeName(i))
		if err := kube.Create(ctx, vm); err != nil {
			return errors.Wrapf(err, "cannot create VirtualMachine %s", vm.Name)
		}
		for w := 1; w < writes; w++ {
			vm.Status.AtProvider.Phase = phases[w%len(phases)]
			if err := kube.Status().Update(ctx, vm); err != nil {
				return errors.Wrapf(err, "cannot update the status of VirtualMachine %s", vm.Name)
			}
		}
		return nil
	})
	if err != nil {
		return Limit{}, err
	}
	l := limit(n, controlPlaneWriters, writes, time.Since(start))
	cpuAfter, err := snapshotCPU()
	if err != nil {
		return Limit{}, err
	}
	cpu := cpuAfter.shareSince(cpuBefore)
	l.CPU = &cpu
	return l, nil
}
