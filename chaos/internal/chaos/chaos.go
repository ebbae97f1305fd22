// Package chaos runs the whole system (internal/harness/stack) under a churn of VMs
// (create, stop, start, delete) and kills, in turn, an agent, the hub, the
// NATS server (or, with NATS as a cluster, the server that is the JetStream
// meta leader) and a libvirtd with SIGKILL, then starts each again; then,
// with HA VMs (availability Restart) among them, a whole node (its agent and
// its libvirtd) and, with one NATS server, a node's partition (its agent cut
// off NATS), each until the node's HA VMs run elsewhere (see ha.go). After
// each restart it checks, against every node's libvirtd and the API, that no
// VM was lost, no guest duplicated or orphaned, and every VM reached the
// power state its spec asks for within the convergence limit; after an
// agent's kill, that its node's loss showed in the API within the
// node-loss limit; after a node's kill or partition, that its HA VMs ran
// elsewhere within the restart limit at the 95th percentile and that no VM
// ever ran on two nodes at once. `make chaos` runs it through chaos/.
package chaos

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	"github.com/digitalocean/go-libvirt"

	vflibvirt "github.com/virtfleet/virtfleet/agent/driver/libvirt"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/harness/stack"
)

// Fault kinds, in the order a round kills them.
const (
	FaultAgent    = "agent"
	FaultHub      = "hub"
	FaultNATS     = "nats"
	FaultLibvirtd = "libvirtd"
	// FaultNode kills a node's agent and libvirtd, FaultPartition cuts its
	// agent off NATS; both only with HA VMs.
	FaultNode      = "node"
	FaultPartition = "partition"
)

// Options size a run. Zero values take the defaults of Defaults.
type Options struct {
	VMs   int
	Nodes int
	// Rounds is how many times the kills are repeated.
	Rounds int
	// HAVMs is how many of the VMs are HA: availability Restart, Volumes
	// in the stack's shared pool. 0 means a fifth of them; below 0 none,
	// and no node or partition fault.
	HAVMs int
	// FenceAfter is the agents' lease and FencingMargin what the hub
	// waits beyond it before it restarts a lost node's HA VMs elsewhere.
	FenceAfter    time.Duration
	FencingMargin time.Duration
	// RestartWithin is the limit, at the 95th percentile, from a node's
	// kill or partition to each of its HA VMs Running elsewhere.
	RestartWithin time.Duration
	// OpsPerSecond is the churn's request rate over all VMs.
	OpsPerSecond float64
	// Down is how long the hub, NATS and a libvirtd stay dead. A killed
	// agent stays dead until its node's loss shows (at most NodeLossWithin
	// plus a margin).
	Down time.Duration
	// ChurnBetween is how long the churn runs alone before each kill.
	ChurnBetween time.Duration
	// ConvergeWithin and NodeLossWithin are the limits checked.
	ConvergeWithin time.Duration
	NodeLossWithin time.Duration
	// NodeTTL is the hub's heartbeat TTL; 0 is the production default.
	NodeTTL time.Duration
	// NATSServers runs NATS as a cluster of that many nats-server
	// processes with replicated buckets when above 1; the NATS fault then
	// kills the JetStream meta leader, one server of the cluster. 0 or 1
	// runs one server, and the NATS fault kills it.
	// The partition fault needs one server: the stack's NATS proxies,
	// which cut an agent off, do not relay to a cluster.
	NATSServers int
	// Dir holds the stack; Keep keeps it (logs) after a passing run.
	Dir  string
	Keep bool
	// Debug makes the hub and agents log at debug level.
	Debug bool
	// Progress receives the progress lines.
	Progress io.Writer
	// BeforeCheck, when set, runs after each restart before the checks, with
	// the churn paused: a test breaks something behind virtfleet's back
	// there to show the checks catch it.
	BeforeCheck func(ctx context.Context, s *stack.Stack, fault FaultResult) error
}

// Defaults are the issues': 200 VMs on 3 nodes, convergence within 30 s of
// the restart, node loss visible within 15 s, a lost node's HA VMs Running
// elsewhere within 60 s at the 95th percentile. The lease is short, so a
// run does not wait long, and long enough (five heartbeats) that the NATS
// fault does not make every node fence itself.
func Defaults() Options {
	return Options{
		VMs: 200, Nodes: 3, Rounds: 1, OpsPerSecond: 10,
		Down: 5 * time.Second, ChurnBetween: 10 * time.Second,
		ConvergeWithin: 30 * time.Second, NodeLossWithin: 15 * time.Second,
		FenceAfter: 10 * time.Second, FencingMargin: 3 * time.Second, RestartWithin: 60 * time.Second,
	}
}

// FaultResult is what one kill showed.
type FaultResult struct {
	Kind   string
	Target string
	// Down is how long the component was dead.
	Down time.Duration
	// NodeLost is how long after the kill the API first showed a VM of the
	// lost node with NodeLost; 0 when no node loss was seen.
	NodeLost time.Duration
	// Converged is how long after the restart every check passed; 0 when
	// they did not pass in time.
	Converged time.Duration
	// OpsDuring is how many churn requests were made while it was dead.
	OpsDuring int64
	// Restarts are, for a node or partition fault, how long after the
	// fault each HA VM that ran on the node was first seen Running on
	// another node, sorted; NotRestarted how many were not seen so before
	// the node came back. Samples is how many times the sampler read every
	// node's running guests meanwhile.
	Restarts     []time.Duration
	NotRestarted int
	Samples      int
	Problems     []Problem
	// Census is each node's domains, counted when the fleet did not
	// converge in time (see Census).
	Census []string
}

// Result of a run.
type Result struct {
	VMs, Nodes     int
	Ops, OpErrors  int64
	OpsByKind      map[string]int64
	Faults         []FaultResult
	ConvergeWithin time.Duration
	NodeLossWithin time.Duration
	RestartWithin  time.Duration
	// HAVMs, FenceAfter and FencingMargin are the run's.
	HAVMs                     int
	FenceAfter, FencingMargin time.Duration
	// Failures are the limits broken and problems found; empty means pass.
	Failures []string
}

// Run starts a stack in o.Dir, creates the VMs, churns them and kills each
// component in turn. An error means the run could not be made; a run that
// was made and found problems returns them in Result.Failures.
func Run(ctx context.Context, o Options) (*Result, error) {
	fillDefaults(&o)
	progress := func(format string, args ...any) {
		fmt.Fprintf(o.Progress, "%s %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
	}
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return nil, errors.Wrap(err, "cannot create the run directory")
	}
	dir, err := os.MkdirTemp(o.Dir, "vf-chaos-")
	if err != nil {
		return nil, errors.Wrap(err, "cannot create the stack directory")
	}
	nodes := make([]string, o.Nodes)
	for i := range nodes {
		nodes[i] = fmt.Sprintf("node%d", i+1)
	}
	progress("starting a stack of %d nodes (NATS as %d process(es) of its own) in %s", o.Nodes, max(o.NATSServers, 1), dir)
	so := stack.Options{Dir: dir, Nodes: nodes, NATSProcess: true, NATSCluster: o.NATSServers, NodeTTL: o.NodeTTL, Debug: o.Debug,
		// While a node is lost, new VMs go to the others: leave room for
		// all of them on one node fewer, also on agents started again.
		CPUAllocationRatio: cpuRatio(o.VMs, o.Nodes), MemoryAllocationRatio: 16}
	if o.HAVMs > 0 {
		so.SharedPool, so.FenceAfter, so.FencingMargin = sharedPool, o.FenceAfter, o.FencingMargin
		so.NATSProxies = partitionable(o)
	}
	s, err := stack.Start(ctx, so)
	if err != nil {
		return nil, errors.Wrapf(err, "cannot start the stack (logs in %s/logs)", dir)
	}
	r := &Result{VMs: o.VMs, Nodes: o.Nodes, ConvergeWithin: o.ConvergeWithin, NodeLossWithin: o.NodeLossWithin,
		RestartWithin: o.RestartWithin, HAVMs: max(o.HAVMs, 0), FenceAfter: o.FenceAfter, FencingMargin: o.FencingMargin}
	defer func() {
		if len(r.Failures) > 0 {
			s.Dump()
		}
		s.Stop()
		if len(r.Failures) > 0 || o.Keep {
			progress("logs kept in %s/logs", dir)
			return
		}
		_ = os.RemoveAll(dir)
	}()
	if err := run(ctx, s, o, r, progress); err != nil {
		r.Failures = append(r.Failures, "run aborted: "+err.Error())
		return r, err
	}
	return r, nil
}

func fillDefaults(o *Options) {
	d := Defaults()
	o.VMs = cmp.Or(o.VMs, d.VMs)
	o.Nodes = cmp.Or(o.Nodes, d.Nodes)
	o.Rounds = cmp.Or(o.Rounds, d.Rounds)
	o.OpsPerSecond = cmp.Or(o.OpsPerSecond, d.OpsPerSecond)
	o.Down = cmp.Or(o.Down, d.Down)
	o.ChurnBetween = cmp.Or(o.ChurnBetween, d.ChurnBetween)
	o.ConvergeWithin = cmp.Or(o.ConvergeWithin, d.ConvergeWithin)
	o.NodeLossWithin = cmp.Or(o.NodeLossWithin, d.NodeLossWithin)
	o.FenceAfter = cmp.Or(o.FenceAfter, d.FenceAfter)
	o.FencingMargin = cmp.Or(o.FencingMargin, d.FencingMargin)
	o.RestartWithin = cmp.Or(o.RestartWithin, d.RestartWithin)
	if o.HAVMs == 0 {
		o.HAVMs = (o.VMs + 4) / 5
	}
	o.HAVMs = min(o.HAVMs, o.VMs)
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	o.Dir = cmp.Or(o.Dir, os.TempDir())
}

// partitionable says whether the run has the partition fault: with HA VMs.
func partitionable(o Options) bool { return o.HAVMs > 0 }

// faults are the kinds a round injects, in order.
func faults(o Options) []string {
	kinds := []string{FaultAgent, FaultHub, FaultNATS, FaultLibvirtd}
	if o.HAVMs > 0 {
		kinds = append(kinds, FaultNode)
	}
	if partitionable(o) {
		kinds = append(kinds, FaultPartition)
	}
	return kinds
}

// cpuRatio fits every VM (1 vCPU) on nodes-1 nodes of the test driver's 16
// CPUs, next to its own 2-vCPU domain, with a margin for uneven placement.
func cpuRatio(vms, nodes int) float64 {
	per := float64(vms)/float64(max(1, nodes-1))*1.2 + 4
	return max(4, math.Ceil(per/16))
}

func run(ctx context.Context, s *stack.Stack, o Options, r *Result, progress func(string, ...any)) error {
	kube, err := newClient(s.ControlPlane.Config, s.ControlPlane.Client)
	if err != nil {
		return err
	}
	ha := max(o.HAVMs, 0)
	progress("creating the network and %d Volumes, %d of them in the shared pool for HA VMs", o.VMs, ha)
	pctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := prepare(pctx, kube, o.VMs, ha); err != nil {
		return errors.Wrap(err, "not every Volume was Ready within 2 minutes")
	}
	workers := max(1, min(o.VMs/4, 16))
	c := newChurn(kube, o.VMs, ha, workers, o.OpsPerSecond)
	obs := &observer{kube: kube}
	octx, stopObserving := context.WithCancel(ctx)
	defer stopObserving()
	go obs.run(octx, o.Progress, c)

	progress("creating %d VMs", o.VMs)
	obs.setPhase("create")
	if err := c.createAll(ctx); err != nil {
		return err
	}
	c.pause()
	start := time.Now()
	if _, _, err := converge(ctx, s, kube, c.want(), time.Now(), 3*time.Minute, nil); err != nil {
		c.resume()
		return errors.Wrap(err, "the VMs did not all reach Running before the chaos")
	}
	c.resume()
	progress("all %d VMs Running after %s", o.VMs, time.Since(start).Round(100*time.Millisecond))

	cctx, stopChurn := context.WithCancel(ctx)
	churnDone := make(chan struct{})
	go func() { c.run(cctx); close(churnDone) }()
	defer func() { stopChurn(); <-churnDone }()

	nodes := sortedKeys(s.Nodes)
	for round := range o.Rounds {
		for i, kind := range faults(o) {
			obs.setPhase("churn")
			if err := sleep(ctx, o.ChurnBetween); err != nil {
				return err
			}
			f := FaultResult{Kind: kind}
			switch kind {
			case FaultAgent:
				f.Target = nodes[round%len(nodes)]
			case FaultLibvirtd:
				f.Target = nodes[(round+1)%len(nodes)]
			}
			var pinned map[string]string
			if haFault(kind) {
				// The node with the most HA VMs running, to measure most.
				if f.Target, pinned, err = c.pinHA(ctx, kube, nodes, round+i); err != nil {
					return err
				}
			}
			if err := inject(ctx, s, o, c, obs, &f, pinned, progress); err != nil {
				return errors.Wrapf(err, "%s kill", kind)
			}
			r.Faults = append(r.Faults, f)
			judge(r, o, f)
		}
	}
	stopChurn()
	<-churnDone
	r.Ops, r.OpErrors = c.ops.Load(), c.errs.Load()
	r.OpsByKind = map[string]int64{"create": c.kinds[opCreate].Load(), "stop": c.kinds[opStop].Load(), "start": c.kinds[opStart].Load(), "delete": c.kinds[opDelete].Load(), "orphan": c.kinds[opOrphan].Load()}
	return nil
}

func judge(r *Result, o Options, f FaultResult) {
	after := "after the " + f.name() + " kill: "
	if f.Kind == FaultPartition {
		after = "after the partition of " + f.Target + ": "
	}
	for _, p := range f.Problems {
		r.Failures = append(r.Failures, after+p.String())
	}
	if f.Converged == 0 {
		r.Failures = append(r.Failures, fmt.Sprintf("%snot converged within %s of the restart", after, o.ConvergeWithin))
		for _, line := range f.Census {
			r.Failures = append(r.Failures, after+line)
		}
	}
	if f.Kind == FaultAgent && (f.NodeLost == 0 || f.NodeLost > o.NodeLossWithin) {
		r.Failures = append(r.Failures, fmt.Sprintf("%snode loss not visible within %s (seen after %s)", after, o.NodeLossWithin, f.NodeLost))
	}
	if !haFault(f.Kind) {
		return
	}
	if Percentile(f.Restarts, f.NotRestarted, 0.95) > o.RestartWithin && len(f.Restarts)+f.NotRestarted > 0 {
		r.Failures = append(r.Failures, fmt.Sprintf("%sHA VMs Running elsewhere %s: beyond %s at p95", after, restartFigures(f.Restarts, f.NotRestarted), o.RestartWithin))
	}
	if f.Samples < 10 {
		r.Failures = append(r.Failures, fmt.Sprintf("%sonly %d samples of the nodes' running guests: no check of double-running", after, f.Samples))
	}
}

// name is the fault's kind and target.
func (f FaultResult) name() string {
	if f.Target == "" {
		return f.Kind
	}
	return f.Kind + " " + f.Target
}

// inject kills one component, keeps it dead while the churn goes on,
// starts it again, then pauses the churn and checks the fleet. For a node
// or partition fault, pinned are the node's HA VMs (uids by name), frozen
// by pinHA: the node stays down until they run elsewhere.
func inject(ctx context.Context, s *stack.Stack, o Options, c *churn, obs *observer, f *FaultResult, pinned map[string]string, progress func(string, ...any)) error {
	defer c.thaw()
	// Of a NATS cluster, the server whose loss costs most: the meta leader.
	natsServer := -1
	if f.Kind == FaultNATS && s.NATSServers() > 1 {
		var err error
		if natsServer, err = s.NATSMetaLeader(ctx); err != nil {
			return err
		}
		f.Target = fmt.Sprintf("nats-server-%d (JetStream meta leader)", natsServer)
	}
	label := f.name()
	obs.setPhase(label + " dead")
	opsBefore := c.ops.Load()
	killed := time.Now()
	var sm *sampler
	if haFault(f.Kind) {
		sm = startSampler(ctx, s, obs.kube, killed)
		defer sm.Stop()
		progress("%s with %d HA VMs running on it", label, len(pinned))
	} else {
		progress("kill -9 %s", label)
	}
	var restart func() error
	switch f.Kind {
	case FaultAgent:
		s.KillAgent(f.Target)
		restart = func() error { return s.StartAgent(f.Target) }
	case FaultHub:
		s.KillHub()
		restart = s.StartHub
	case FaultNATS:
		if natsServer >= 0 {
			s.KillNATSServer(natsServer)
			restart = func() error { return s.StartNATSServer(natsServer) }
			break
		}
		s.KillNATS()
		restart = s.StartNATS
	case FaultLibvirtd:
		s.Nodes[f.Target].Kill()
		restart = func() error { return s.Nodes[f.Target].Restart(ctx) }
	case FaultNode:
		s.KillAgent(f.Target)
		s.Nodes[f.Target].Kill()
		// A fresh libvirtd (the test driver's state is gone), then the
		// agent, as a node that rebooted.
		restart = func() error {
			if err := s.Nodes[f.Target].Restart(ctx); err != nil {
				return err
			}
			return s.StartAgent(f.Target)
		}
	case FaultPartition:
		if err := s.CutAgent(f.Target); err != nil {
			return err
		}
		restart = func() error { return s.HealAgent(f.Target) }
	}
	noteLost := func() {
		if lost := obs.lostSince(killed); f.NodeLost == 0 && lost > 0 {
			f.NodeLost = lost
			progress("node loss visible in the API %s after the kill", lost.Round(100*time.Millisecond))
		}
	}
	// The agent stays dead until its node's loss shows, a node until its
	// HA VMs run elsewhere, the others for Down.
	until := killed.Add(o.Down)
	switch {
	case f.Kind == FaultAgent:
		until = killed.Add(o.NodeLossWithin + 5*time.Second)
	case haFault(f.Kind) && len(pinned) > 0:
		// Past the limit, so a slow restart is measured, not only failed.
		until = killed.Add(o.RestartWithin + 30*time.Second)
	}
	if haFault(f.Kind) {
		var err error
		if f.Restarts, f.NotRestarted, err = awaitRestarts(ctx, obs.kube, pinned, f.Target, killed, until, noteLost); err != nil {
			return err
		}
		progress("%s: HA VMs Running elsewhere %s", label, restartFigures(f.Restarts, f.NotRestarted))
		if f.NotRestarted > 0 {
			// The hub says in NodeLost why a VM stays.
			vms, err := listVMs(ctx, obs.kube)
			if err != nil {
				return err
			}
			for _, vm := range vms {
				if pinned[vm.Name] == vm.UID && (vm.Node == f.Target || vm.Phase != string(v1alpha1.PhaseRunning)) {
					progress("%s not Running elsewhere: phase %s on %s; %s", vm.Name, vm.Phase, vm.Node, vm.NodeLost)
				}
			}
		}
	}
	// A node without HA VMs stays down for Down too, so that the sampler
	// still looks for guests running twice.
	for time.Now().Before(until) && !(f.Kind == FaultAgent && f.NodeLost > 0) && !(haFault(f.Kind) && len(pinned) > 0) {
		noteLost()
		if err := sleep(ctx, 100*time.Millisecond); err != nil {
			return err
		}
	}
	if err := restart(); err != nil {
		return errors.Wrap(err, "cannot restart")
	}
	restarted := time.Now()
	f.Down = restarted.Sub(killed)
	f.OpsDuring = c.ops.Load() - opsBefore
	back := "restarted"
	if f.Kind == FaultPartition {
		back = "healed"
	}
	progress("%s %s after %s; %d churn requests meanwhile", label, back, f.Down.Round(100*time.Millisecond), f.OpsDuring)

	obs.setPhase(label + " converging")
	c.pause()
	defer c.resume()
	if o.BeforeCheck != nil {
		if err := o.BeforeCheck(ctx, s, *f); err != nil {
			return err
		}
	}
	if f.Kind == FaultPartition {
		if err := awaitLeftovers(ctx, s, f.Target, pinned, restarted.Add(o.ConvergeWithin)); err != nil {
			return err
		}
	}
	// Wait past the limit, so a slow convergence is measured, not only
	// failed; but judge against the limit.
	took, problems, err := converge(ctx, s, obs.kube, c.want(), restarted, o.ConvergeWithin+30*time.Second, progress)
	f.Problems = problems
	if err != nil || took > o.ConvergeWithin {
		f.Census = census(ctx, s, obs.kube)
	}
	if err == nil && took <= o.ConvergeWithin {
		f.Converged = took
	}
	if err == nil {
		progress("converged %s after the restart (%d VMs wanted)", took.Round(100*time.Millisecond), countTrue(c.want()))
	} else {
		progress("NOT converged: %v", err)
	}
	if f.NodeLost == 0 && f.Kind == FaultAgent {
		f.NodeLost = obs.lostSince(killed)
	}
	if sm != nil {
		doubles, n := sm.stop()
		f.Problems = append(f.Problems, doubles...)
		f.Samples = n
		progress("%d samples of every node's running guests since the fault: %d VMs seen running twice", n, len(doubles))
	}
	return nil
}

// converge checks the fleet until every check passes or limit after start
// ends. It returns how long after start that was and the problems that
// remained; duplicated guests are returned whenever they were seen.
func converge(ctx context.Context, s *stack.Stack, kube client.Client, want map[string]bool, start time.Time, limit time.Duration, logProblems func(string, ...any)) (time.Duration, []Problem, error) {
	lastLog := time.Now()
	var fatal []Problem
	var last []Problem
	for {
		vms, err := listVMs(ctx, kube)
		if err != nil {
			return 0, nil, err
		}
		doms, err := listDomains(s)
		if err == nil {
			last = Check(want, vms, doms)
			for _, p := range Fatal(last) {
				if !slices.Contains(fatal, p) {
					fatal = append(fatal, p)
				}
			}
			if len(last) == 0 {
				return time.Since(start), fatal, nil
			}
		} else {
			last = []Problem{{Kind: NotConverged, Message: err.Error()}}
		}
		if logProblems != nil && time.Since(lastLog) >= 5*time.Second {
			logProblems("still %d problems %s after the restart, first: %s", len(last), time.Since(start).Round(100*time.Millisecond), last[0])
			lastLog = time.Now()
		}
		if time.Since(start) > limit {
			for _, p := range fatal {
				if !slices.Contains(last, p) {
					last = append(last, p)
				}
			}
			return 0, last, errors.Errorf("%d problems after %s, first: %s", len(last), limit, last[0])
		}
		if err := sleep(ctx, 250*time.Millisecond); err != nil {
			return 0, nil, err
		}
	}
}

// census is Census of the fleet now, or why it could not be read.
func census(ctx context.Context, s *stack.Stack, kube client.Client) []string {
	vms, err := listVMs(ctx, kube)
	if err != nil {
		return []string{"no census: " + err.Error()}
	}
	doms, err := listDomains(s)
	if err != nil {
		return []string{"no census: " + err.Error()}
	}
	return Census(vms, doms)
}

// why renders a VM's Ready condition for a problem's message.
func why(c xpv2.Condition) string {
	if c.Message == "" {
		return string(c.Reason)
	}
	return string(c.Reason) + ": " + c.Message
}

// typeNodeLost is the hub's condition of a VM whose node is lost
// (hub/internal/controller/virtualmachine.TypeNodeLost, out of reach here).
const typeNodeLost xpv2.ConditionType = "NodeLost"

func listVMs(ctx context.Context, kube client.Client) ([]VM, error) {
	l := &v1alpha1.VirtualMachineList{}
	if err := kube.List(ctx, l, client.InNamespace(namespace)); err != nil {
		return nil, errors.Wrap(err, "cannot list VirtualMachines")
	}
	out := make([]VM, 0, len(l.Items))
	for i := range l.Items {
		vm := &l.Items[i]
		out = append(out, VM{
			Name:        vm.Name,
			UID:         string(vm.UID),
			WantRunning: vm.Spec.ForProvider.Running == nil || *vm.Spec.ForProvider.Running,
			Deleting:    vm.DeletionTimestamp != nil,
			Phase:       string(vm.Status.AtProvider.Phase),
			Node:        vm.Status.AtProvider.Node,
			Why:         why(vm.GetCondition(xpv2.TypeReady)),
			Confirmed:   vm.Status.AtProvider.ObservedGeneration >= vm.Generation,
			NodeLost:    why(vm.GetCondition(typeNodeLost)),
		})
	}
	return out, nil
}

// listDomains reads every node's domains behind virtfleet's back.
func listDomains(s *stack.Stack) (map[string][]Domain, error) {
	out := map[string][]Domain{}
	for name, n := range s.Nodes {
		l, err := n.Dial()
		if err != nil {
			return nil, errors.Wrapf(err, "node %s", name)
		}
		// One list, then each domain's state: two lists (active, then
		// inactive) would show a guest that stopped in between twice.
		doms, _, err := l.ConnectListAllDomains(1, 0)
		if err != nil {
			_ = l.Disconnect()
			return nil, errors.Wrapf(err, "cannot list the domains of %s", name)
		}
		for _, d := range doms {
			state, _, err := l.DomainGetState(d, 0)
			if err != nil {
				continue // gone since the list
			}
			s := libvirt.DomainState(state)
			dom := Domain{UUID: uuid.UUID(d.UUID).String(), Name: d.Name, Active: s != libvirt.DomainShutoff && s != libvirt.DomainCrashed && s != libvirt.DomainNostate}
			if x, err := l.DomainGetXMLDesc(d, 0); err == nil {
				if owner, ok, perr := vflibvirt.OwnerOf(x); ok && perr == nil {
					dom.Owner, dom.Orphaned = owner.UID, owner.Orphaned
				}
			}
			out[name] = append(out[name], dom)
		}
		_ = l.Disconnect()
	}
	return out, nil
}

// observer lists the VMs twice a second for the progress line and for
// the node-loss time.
type observer struct {
	kube  client.Client
	mu    sync.Mutex
	phase string
	// lostAt is when a VM was first seen with NodeLost True (zero: not now).
	lostAt time.Time
}

func (ob *observer) setPhase(p string) {
	ob.mu.Lock()
	ob.phase = p
	ob.mu.Unlock()
}

// lostSince is how long after t node loss was first seen, or 0.
func (ob *observer) lostSince(t time.Time) time.Duration {
	ob.mu.Lock()
	defer ob.mu.Unlock()
	if ob.lostAt.IsZero() || ob.lostAt.Before(t) {
		return 0
	}
	return ob.lostAt.Sub(t)
}

const observeEvery = 250 * time.Millisecond

func (ob *observer) run(ctx context.Context, w io.Writer, c *churn) {
	lastLine := time.Now()
	lastOps := c.ops.Load()
	lastDone := 0
	for {
		if err := sleep(ctx, observeEvery); err != nil {
			return
		}
		l := &v1alpha1.VirtualMachineList{}
		if err := ob.kube.List(ctx, l, client.InNamespace(namespace)); err != nil {
			continue
		}
		now := time.Now()
		done, lost := 0, false
		for i := range l.Items {
			vm := &l.Items[i]
			want := v1alpha1.PhaseStopped
			if vm.Spec.ForProvider.Running == nil || *vm.Spec.ForProvider.Running {
				want = v1alpha1.PhaseRunning
			}
			if vm.DeletionTimestamp == nil && vm.Status.AtProvider.Phase == want {
				done++
			}
			if vm.GetCondition("NodeLost").Status == corev1.ConditionTrue {
				lost = true
			}
		}
		ob.mu.Lock()
		if lost && ob.lostAt.IsZero() {
			ob.lostAt = now
		} else if !lost {
			ob.lostAt = time.Time{}
		}
		phase := ob.phase
		ob.mu.Unlock()
		if now.Sub(lastLine) >= 2*time.Second {
			ops := c.ops.Load()
			rate := float64(ops-lastOps) / now.Sub(lastLine).Seconds()
			nodeLost := ""
			if lost {
				nodeLost = ", node lost"
			}
			doneRate := float64(done-lastDone) / now.Sub(lastLine).Seconds()
			fmt.Fprintf(w, "%s   [%s] %d/%d VMs in their wanted state (%+.1f/s), %d churn requests (%.1f/s)%s\n",
				now.Format("15:04:05"), phase, done, len(l.Items), doneRate, ops, rate, nodeLost)
			lastLine, lastOps, lastDone = now, ops, done
		}
	}
}

// newClient is a client of its own without client-side rate limiting, as
// the benchmark's.
func newClient(cfg *rest.Config, c client.Client) (client.Client, error) {
	cfg = rest.CopyConfig(cfg)
	cfg.QPS, cfg.Burst = -1, 0
	cl, err := client.New(cfg, client.Options{Scheme: c.Scheme()})
	return cl, errors.Wrap(err, "cannot create the chaos client")
}

func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

func countTrue(m map[string]bool) int {
	n := 0
	for _, v := range m {
		if v {
			n++
		}
	}
	return n
}

// Summary is the run's result as text, one line per kill.
func Summary(r *Result) string {
	var b strings.Builder
	fmt.Fprintf(&b, "chaos: %d VMs (%d HA) on %d nodes, %d churn requests (%v), %d failed requests retried\n", r.VMs, r.HAVMs, r.Nodes, r.Ops, r.OpsByKind, r.OpErrors)
	fmt.Fprintf(&b, "%-16s %8s %12s %12s %8s\n", "kill -9", "down", "node lost", "converged", "ops")
	restarts := map[string][]time.Duration{}
	missing := map[string]int{}
	for _, f := range r.Faults {
		name := f.name()
		lost, conv := "-", "FAILED"
		if f.NodeLost > 0 {
			lost = f.NodeLost.Round(100 * time.Millisecond).String()
		}
		if f.Converged > 0 {
			conv = f.Converged.Round(100 * time.Millisecond).String()
		}
		fmt.Fprintf(&b, "%-16s %8s %12s %12s %8d\n", name, f.Down.Round(100*time.Millisecond), lost, conv, f.OpsDuring)
		if haFault(f.Kind) {
			fmt.Fprintf(&b, "  HA VMs Running elsewhere: %s; %d samples of the nodes\n", restartFigures(f.Restarts, f.NotRestarted), f.Samples)
			restarts[f.Kind] = append(restarts[f.Kind], f.Restarts...)
			missing[f.Kind] += f.NotRestarted
		}
	}
	fmt.Fprintf(&b, "limits: converged within %s of each restart; node loss visible within %s of an agent's kill", r.ConvergeWithin, r.NodeLossWithin)
	if len(restarts) == 0 {
		b.WriteString("\n")
	} else {
		fmt.Fprintf(&b, "; HA VMs Running elsewhere within %s of a node's kill or partition at p95, never on two nodes at once\n", r.RestartWithin)
	}
	for _, kind := range []string{FaultNode, FaultPartition} {
		if d, ok := restarts[kind]; ok {
			slices.Sort(d)
			what := map[string]string{FaultNode: "node death", FaultPartition: "node partition"}[kind]
			fmt.Fprintf(&b, "%s → Running elsewhere: %s (lease %s, fencing margin %s)\n", what, restartFigures(d, missing[kind]), r.FenceAfter, r.FencingMargin)
		}
	}
	if len(restarts) > 0 {
		b.WriteString("anchors, node death → running elsewhere: " + Anchors + "\n")
	}
	if len(r.Failures) == 0 {
		b.WriteString("PASS: no VM lost, no guest duplicated or orphaned")
		if len(restarts) > 0 {
			b.WriteString(", no VM running on two nodes at once")
		}
		b.WriteString("\n")
	} else {
		b.WriteString("FAIL:\n")
		for _, f := range r.Failures {
			b.WriteString("  " + f + "\n")
		}
	}
	return b.String()
}
