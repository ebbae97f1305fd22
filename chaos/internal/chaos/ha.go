package chaos

// The node and partition faults, with HA VMs (availability Restart, Volumes
// in the stack's shared pool): a node whose agent and libvirtd are killed,
// or whose agent is cut off NATS while it and its guests run on, stays so
// until every HA VM that ran there runs on another node. Each of those VMs'
// time from the kill (or cut) to Running elsewhere, as the API shows it, is
// measured, and a sampler reads every node's libvirtd throughout, behind
// virtfleet's back, to catch a VM running on two nodes at once.

import (
	"context"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/bench/workload"
	"github.com/virtfleet/virtfleet/internal/harness/stack"
)

// Anchors are what others take from a node's death to its VMs running
// elsewhere, printed beside the run's figure.
const Anchors = "Proxmox VE HA about 2 min end to end (watchdog self-fencing after 60 s); " +
	"Harvester ~63 s at best; OpenShift with its remediation operators ≈545 s by default; " +
	"KubeVirt alone never (kubevirt/kubevirt#10146)"

// never stands for a restart that was not seen.
const never = time.Duration(math.MaxInt64)

// haFault says whether kind is a node fault that measures HA restarts.
func haFault(kind string) bool { return kind == FaultNode || kind == FaultPartition }

// haWait is how long pinHA waits for the churn to leave an HA VM running
// somewhere: a fault on a node without one measures no restart.
const haWait = 30 * time.Second

// pinHA picks the node, of nodes, with the most HA VMs running (the first
// from start on a tie), and freezes the churn of those VMs, so that each
// is wanted Running throughout the fault. It returns the node and its HA
// VMs' uids by name. While no node runs an HA VM (the churn may have
// stopped them all) it looks again, for up to haWait.
func (c *churn) pinHA(ctx context.Context, kube client.Client, nodes []string, start int) (string, map[string]string, error) {
	until := time.Now().Add(haWait)
	for {
		target, pinned, err := c.pinHAOnce(ctx, kube, nodes, start)
		if err != nil || len(pinned) > 0 || time.Now().After(until) {
			return target, pinned, err
		}
		if err := sleep(ctx, observeEvery); err != nil {
			return "", nil, err
		}
	}
}

// pinHAOnce is one look of pinHA's.
func (c *churn) pinHAOnce(ctx context.Context, kube client.Client, nodes []string, start int) (string, map[string]string, error) {
	c.pause()
	defer c.resume()
	vms, err := listVMs(ctx, kube)
	if err != nil {
		return "", nil, err
	}
	ha := map[string]*slot{}
	for _, s := range c.slots {
		if s.ha && s.exists && s.running && !s.deleting {
			ha[workload.VMName(s.i)] = s
		}
	}
	on := map[string]map[string]string{}
	for _, vm := range vms {
		// A VM whose node has not confirmed its current spec (started a
		// moment ago, say) is not restarted elsewhere by design: the hub
		// cannot know the guest there fences itself.
		if ha[vm.Name] != nil && !vm.Deleting && vm.Phase == string(v1alpha1.PhaseRunning) && vm.Node != "" && vm.Confirmed {
			if on[vm.Node] == nil {
				on[vm.Node] = map[string]string{}
			}
			on[vm.Node][vm.Name] = vm.UID
		}
	}
	target := nodes[start%len(nodes)]
	for i := range nodes {
		if n := nodes[(start+i)%len(nodes)]; len(on[n]) > len(on[target]) {
			target = n
		}
	}
	for name := range on[target] {
		ha[name].frozen.Store(true)
	}
	return target, on[target], nil
}

// thaw lets the churn at every slot again.
func (c *churn) thaw() {
	for _, s := range c.slots {
		s.frozen.Store(false)
	}
}

// awaitRestarts lists the VMs until every one of pinned (uids by name) runs
// on a node other than lost, or until ends; it returns how long after
// since each was first seen so, sorted, and how many were not.
func awaitRestarts(ctx context.Context, kube client.Client, pinned map[string]string, lost string, since, until time.Time, tick func()) ([]time.Duration, int, error) {
	pending := maps.Clone(pinned)
	var took []time.Duration
	for len(pending) > 0 && time.Now().Before(until) {
		vms, err := listVMs(ctx, kube)
		if err == nil {
			now := time.Now()
			for _, vm := range vms {
				if pending[vm.Name] == vm.UID && vm.Phase == string(v1alpha1.PhaseRunning) && vm.Node != "" && vm.Node != lost {
					took = append(took, now.Sub(since))
					delete(pending, vm.Name)
				}
			}
		}
		tick()
		if err := sleep(ctx, observeEvery); err != nil {
			return nil, 0, err
		}
	}
	slices.Sort(took)
	return took, len(pending), nil
}

// awaitLeftovers waits, until ends, for node to hold no guest of the VMs
// whose uids are given: the copies it fenced while cut off, deleted once it
// learns the VMs run elsewhere. Until then Check would count them twice.
func awaitLeftovers(ctx context.Context, s *stack.Stack, node string, uids map[string]string, until time.Time) error {
	gone := map[string]bool{}
	for _, uid := range uids {
		gone[uid] = true
	}
	for time.Now().Before(until) {
		doms, err := listDomains(s)
		if err == nil && !slices.ContainsFunc(doms[node], func(d Domain) bool { return gone[d.UUID] || gone[d.Owner] }) {
			return nil
		}
		if err := sleep(ctx, observeEvery); err != nil {
			return err
		}
	}
	return nil
}

// Percentile is the p-th percentile (nearest rank) of sorted durations and
// missing ones that count as never; never when there are none.
func Percentile(sorted []time.Duration, missing int, p float64) time.Duration {
	n := len(sorted) + missing
	if n == 0 {
		return never
	}
	i := max(0, int(math.Ceil(p*float64(n)))-1)
	if i >= len(sorted) {
		return never
	}
	return sorted[i]
}

// restartFigures renders p50, p95 and max of restarts, n of them seen and
// missing not.
func restartFigures(sorted []time.Duration, missing int) string {
	f := func(d time.Duration) string {
		if d == never {
			return "never"
		}
		return d.Round(100 * time.Millisecond).String()
	}
	out := fmt.Sprintf("p50 %s, p95 %s, max %s over %d HA VMs", f(Percentile(sorted, missing, 0.5)), f(Percentile(sorted, missing, 0.95)), f(Percentile(sorted, missing, 1)), len(sorted)+missing)
	if missing > 0 {
		out += fmt.Sprintf(" (%d never Running elsewhere)", missing)
	}
	return out
}

// sampler is the stack's Sampler of every node, reading each node's
// libvirtd behind virtfleet's back, a guest counted for a VM when its UUID
// is the VM's uid or the uid of the orphan the VM adopted; the test
// driver's own domain, running on every node, is no VM's.
type sampler struct {
	*stack.Sampler
	kube  client.Client
	since time.Time
	// owner is the VM uid (and name) of every guest uid seen in the API
	// since the start, as the guest outlives an adopted annotation. Only
	// the Sampler's goroutine touches it until Stop.
	owner map[string][2]string
}

func startSampler(ctx context.Context, s *stack.Stack, kube client.Client, since time.Time) *sampler {
	sm := &sampler{kube: kube, since: since, owner: map[string][2]string{}}
	sm.Sampler = s.StartSampler(ctx, sortedKeys(s.Nodes), stack.SamplerOptions{VMOf: sm.vmOf, Learn: sm.learn})
	return sm
}

// vmOf is the uid of the VM whose guest has this uid.
func (sm *sampler) vmOf(guest string) (string, bool) {
	id, ok := sm.owner[guest]
	return id[0], ok
}

// learn records the guest uids of every VM in the API.
func (sm *sampler) learn(ctx context.Context) {
	l := &v1alpha1.VirtualMachineList{}
	if err := sm.kube.List(ctx, l, client.InNamespace(namespace)); err != nil {
		return
	}
	for i := range l.Items {
		vm := &l.Items[i]
		id := [2]string{string(vm.UID), vm.Name}
		sm.owner[string(vm.UID)] = id
		if adopted := vm.GetAnnotations()[v1alpha1.AnnotationAdopted]; adopted != "" {
			sm.owner[adopted] = id
		}
	}
}

// stop ends the sampling and returns the VMs seen running twice and how
// many samples were taken.
func (sm *sampler) stop() ([]Problem, int) {
	sm.Stop()
	doubles := sm.Doubles()
	out := make([]Problem, 0, len(doubles))
	for _, uid := range sortedKeys(doubles) {
		d := doubles[uid]
		out = append(out, Problem{Kind: DoubleRunning, Message: fmt.Sprintf("VM %s (%s) seen running on %s in one sample, %s after the fault began",
			sm.owner[uid][1], uid, strings.Join(d.Nodes, " and "), d.At.Sub(sm.since).Round(time.Millisecond))})
	}
	return out, sm.Samples()
}
