package benchmark

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"libvirt.org/go/libvirtxml"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"
	"github.com/crossplane/crossplane-runtime/v2/pkg/reconciler/managed"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/bench/workload"
	"github.com/virtfleet/virtfleet/internal/harness/libvirttest"
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
	return replay(ctx, ns, n, writes, "cp", func(ctx context.Context, vm *v1alpha1.VirtualMachine) error {
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
}

// wholeFlowRequests are the writes wholeFlow makes per VM, as the burst's
// request table names them (verb and resource, without the status code).
var wholeFlowRequests = []string{
	"POST virtualmachines", "PUT virtualmachines", "PUT virtualmachines/status",
	"PATCH volumes", "PUT volumes/status",
	"POST networkaddresses",
}

// wholeFlowWrites is how many API writes wholeFlow makes per VM.
var wholeFlowWrites = len(wholeFlowRequests)

// unreplayed names the writes of a burst, among rows, that came about once
// per VM or more (half a write per VM, rounded) and that wholeFlow does not
// replay: when the hub's writes change, the replay must follow by hand,
// and the scenario's notes say so until it does.
func unreplayed(rows []RequestCount) []string {
	var out []string
	for _, r := range rows {
		verb, rest, _ := strings.Cut(r.Request, " ")
		resource, _, _ := strings.Cut(rest, " ")
		if !writeVerbs[verb] || r.PerVM < 0.5 || slices.Contains(wholeFlowRequests, verb+" "+resource) {
			continue
		}
		out = append(out, fmt.Sprintf("%s (%.2f per VM)", r.Request, r.PerVM))
	}
	return out
}

// wholeFlow is the API server's limit for every write a VM of the burst
// costs, not only the VM's own: a plain client, with no hub, no agent and
// no watch, replays for each of n VMs what the burst's "API writes by
// request" table shows about once per VM, in the order virtfleet makes
// them:
//   - the VM's create, its binding (node annotation and finalizer) and its
//     status;
//   - a merge patch of its Volume (virtfleet's binding) and the Volume's
//     status;
//   - the NetworkAddress that records the address the hub allocated it.
//
// Events are not replayed: the hub records Normal events within a budget,
// so a burst costs far less than one per VM (the burst's table shows how
// many).
//
// It uses the burst's Volumes, VolumeName(i), which must exist in ns. It is
// what the burst's rate would be if virtfleet cost the API server nothing
// beyond its writes, and the limit the control plane's (three VM writes)
// cannot be: a VM of virtfleet is more than its own object.
func wholeFlow(ctx context.Context, kube client.Client, ns string, n int) (Limit, error) {
	return replay(ctx, ns, n, wholeFlowWrites, "wf", func(ctx context.Context, vm *v1alpha1.VirtualMachine) error {
		return replayVM(ctx, kube, vm, "node1")
	})
}

// replayVM makes wholeFlow's writes for vm, which boots from one Volume.
func replayVM(ctx context.Context, kube client.Client, vm *v1alpha1.VirtualMachine, node string) error {
	if err := kube.Create(ctx, vm); err != nil {
		return errors.Wrapf(err, "cannot create VirtualMachine %s", vm.Name)
	}
	meta.AddAnnotations(vm, map[string]string{v1alpha1.AnnotationNode: node})
	meta.AddFinalizer(vm, managed.FinalizerName)
	if err := kube.Update(ctx, vm); err != nil {
		return errors.Wrapf(err, "cannot bind VirtualMachine %s", vm.Name)
	}
	vm.Status.AtProvider = v1alpha1.VirtualMachineObservation{ID: string(vm.UID), Phase: v1alpha1.PhaseRunning, Node: node, IP: "10.20.0.2"}
	vm.Status.SetConditions(xpv2.Available(), xpv2.ReconcileSuccess())
	if err := kube.Status().Update(ctx, vm); err != nil {
		return errors.Wrapf(err, "cannot update the status of VirtualMachine %s", vm.Name)
	}

	vol := &v1alpha1.Volume{ObjectMeta: metav1.ObjectMeta{Namespace: vm.Namespace, Name: string(vm.Spec.ForProvider.DiskAttachments[0].Name)}}
	patch := client.MergeFrom(vol.DeepCopy())
	meta.AddAnnotations(vol, map[string]string{replayedBy: vm.Name})
	if err := kube.Patch(ctx, vol, patch); err != nil {
		return errors.Wrapf(err, "cannot patch Volume %s", vol.Name)
	}
	vol.Status.SetConditions(xpv2.Condition{Type: replayedCondition, Status: corev1.ConditionTrue, Reason: "Replayed", LastTransitionTime: metav1.Now()})
	if err := kube.Status().Update(ctx, vol); err != nil {
		return errors.Wrapf(err, "cannot update the status of Volume %s", vol.Name)
	}

	network := string(vm.Spec.ForProvider.VirtualNetworks[0])
	n := replayedAddresses.Add(1)
	addr := netip.AddrFrom4([4]byte{172, byte(16 + n>>16), byte(n >> 8), byte(n)})
	na := &v1alpha1.NetworkAddress{
		ObjectMeta: metav1.ObjectMeta{Namespace: vm.Namespace, Name: network + "." + addr.String()},
		Spec:       v1alpha1.NetworkAddressSpec{Network: v1alpha1.LocalName(network), Address: addr.String(), VirtualMachine: v1alpha1.LocalName(vm.Name), VirtualMachineUID: string(vm.UID)},
	}
	return errors.Wrapf(kube.Create(ctx, na), "cannot record an address of VirtualMachine %s", vm.Name)
}

// replayedAddresses counts the addresses replayVM recorded in this process,
// so each is another, outside the range of the burst's network.
var replayedAddresses atomic.Uint32

// The marks wholeFlow leaves on the burst's Volumes: a write must change
// something, or the API server skips it.
const (
	replayedBy                           = "bench.virtfleet.io/replayed-by"
	replayedCondition xpv2.ConditionType = "Replayed"
)

// replay times writeVM, which makes writes API writes for one VM, over n
// benchmark VMs in ns named prefix-NNNN, controlPlaneWriters at once, and
// measures the machine's CPU over it.
func replay(ctx context.Context, ns string, n, writes int, prefix string, writeVM func(context.Context, *v1alpha1.VirtualMachine) error) (Limit, error) {
	f := fleet
	f.Namespace = ns
	cpuBefore, err := snapshotCPU()
	if err != nil {
		return Limit{}, err
	}
	start := time.Now()
	err = workload.Parallel(ctx, n, controlPlaneWriters, func(ctx context.Context, i int) error {
		return writeVM(ctx, f.VM(fmt.Sprintf("%s-%04d", prefix, i), workload.VolumeName(i)))
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
