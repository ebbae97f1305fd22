// Package benchmark measures virtfleet on the real stack (kube-apiserver,
// NATS, the hub and agents as processes, libvirtd on the test driver): how
// fast VMs reach Running one by one and in bursts, what that costs in API
// writes, memory and CPU, and how the rate compares with two limits measured
// in the same run, raw libvirt and the control plane itself. `make bench`
// runs it through bench/.
package benchmark

import (
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/bench/workload"
	"github.com/virtfleet/virtfleet/internal/harness/controlplane"
	"github.com/virtfleet/virtfleet/internal/harness/libvirttest"
	"github.com/virtfleet/virtfleet/internal/harness/stack"
	"github.com/virtfleet/virtfleet/internal/memlimit"
)

// Options size the run.
type Options struct {
	// Density VMs are created DensityInterval apart over DensityNodes nodes;
	// 0 skips the density scenario.
	Density         int
	DensityNodes    int
	DensityInterval time.Duration
	// Sizes are the bursts, each created all at once over Nodes nodes on a
	// fresh stack; the largest is judged against the burst targets.
	Sizes []int
	Nodes int
	// VMsPerNode is the most VMs a burst puts on one node: a larger
	// burst gets more nodes than Nodes (5000 VMs over 50 nodes), so the
	// cost's growth is the hub's, not a node's.
	VMsPerNode int
	// Limits measures raw libvirt and the control plane after each burst.
	Limits bool
	// Scale are bursts over simulated nodes, VMsPerNode VMs per node, each
	// on a fresh stack. With Limits, those of at most simulatedLimitVMs
	// are followed by the whole-flow limit alone: the control plane's
	// cost apart from the hypervisors', which share this machine's cores
	// in the other bursts.
	Scale []int
	// Dir holds each scenario's stack (logs are kept when one fails).
	Dir string
	// Quick marks the harness's own small run in the result.
	Quick bool
	// Keep keeps every stack's directory (logs) instead of only failed ones'.
	Keep bool
	// Debug makes the hub and agents log at debug level.
	Debug bool
	// Pprof makes the hub and agents of each stack serve Go's profiles,
	// their addresses in the progress.
	Pprof bool
	// Guests boots one real QEMU guest through the whole stack (guest.go).
	Guests bool
	// Snapshots, with Guests, snapshots that guest disk-only and with its
	// memory and restores it, while a prober pings it (snapshot.go).
	Snapshots bool
	// Backups, with Guests, backs the first guest up whole and then
	// incrementally to an object store started with its stack, beside a
	// raw upload to the same store, and restores it (backup.go).
	Backups bool
	// Migration boots another real guest on two hosts and migrates it
	// live (migration.go).
	Migration bool
	// Idle runs the idle-node scenario (idle.go).
	Idle bool
	// DenseSimulated and DenseLibvirt run the dense nodes (idle.go): one
	// simulated node of 1,000 guests, and one of 500 domains on the test
	// driver.
	DenseSimulated bool
	DenseLibvirt   bool
	// Progress receives a line per step.
	Progress io.Writer
}

// Defaults are the issues' sizes: density 100 VMs 100 ms apart over 10
// nodes; bursts of 10, 100 and 1000 over 10 nodes, and 5000 over 50; and
// bursts of 1000 and 10,000 over 10 and 100 simulated nodes.
func Defaults() Options {
	return Options{Density: 100, DensityNodes: 10, DensityInterval: 100 * time.Millisecond, Sizes: []int{10, 100, 1000, 5000}, Scale: []int{1000, 10000}, Nodes: 10, VMsPerNode: 100, Limits: true, Guests: true, Snapshots: true, Backups: true, Migration: true, Idle: true, DenseSimulated: true, DenseLibvirt: true}
}

// Quick is small enough for a test of the harness on a busy 2-core machine.
func Quick() Options {
	return Options{Density: 5, DensityNodes: 2, DensityInterval: 100 * time.Millisecond, Sizes: []int{8}, Scale: []int{8}, Nodes: 2, VMsPerNode: 4, Limits: true, Quick: true}
}

// The test driver's host as every node's libvirtd reports it, and the
// agent's default CPU allocation ratio; used to check that a scenario fits.
const (
	hostCPUs           = 16
	hostMemoryBytes    = 3 << 30
	defaultCPURatio    = 4
	defaultMemoryRatio = 8
	// testDomain is the test driver's own running domain "test": 2 vCPUs
	// and 8 GiB, counted as room that is taken.
	testDomainVCPU        = 2
	testDomainMemoryBytes = 8 << 30
)

// simulatedLimitVMs is the largest burst over simulated nodes that the
// whole-flow limit follows: replaying 10,000 VMs would add minutes and
// say nothing the 1000 do not.
const simulatedLimitVMs = 1000

// settle is how long the run waits after the last VM is Running before the
// last snapshot, so the writes that finish the last VMs (the final status
// update) are counted.
const settle = 2 * time.Second

// Run runs every scenario and returns the result, targets included. When a
// scenario fails it returns the error with the result of the scenarios
// before it, which says where the run stopped.
func Run(ctx context.Context, o Options) (*Result, error) {
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	r := &Result{Date: time.Now().UTC(), Quick: o.Quick, Machine: ThisMachine(), Scenarios: o.scenarios()}
	r.Commit, r.Dirty = Commit()
	if o.Density > 0 {
		s, err := runScenario(ctx, o, spec{name: "density", vms: o.Density, nodes: o.DensityNodes, interval: o.DensityInterval})
		if err != nil {
			return r.stop(errors.Wrap(err, "density"))
		}
		r.Density = &s
	}
	sizes := slices.Clone(o.Sizes)
	slices.Sort(sizes)
	for _, n := range slices.Compact(sizes) {
		nodes := o.Nodes
		if o.VMsPerNode > 0 {
			nodes = max(nodes, (n+o.VMsPerNode-1)/o.VMsPerNode)
		}
		s, err := runScenario(ctx, o, spec{name: fmt.Sprintf("burst-%d", n), vms: n, nodes: nodes, limits: o.Limits})
		if err != nil {
			return r.stop(errors.Wrapf(err, "burst of %d", n))
		}
		r.Bursts = append(r.Bursts, s)
	}
	scale := slices.Clone(o.Scale)
	slices.Sort(scale)
	for _, n := range slices.Compact(scale) {
		nodes := max(1, (n+o.VMsPerNode-1)/max(o.VMsPerNode, 1))
		s, err := runScenario(ctx, o, spec{name: fmt.Sprintf("simulated-%d", n), vms: n, nodes: nodes, simulated: true, limits: o.Limits && n <= simulatedLimitVMs})
		if err != nil {
			return r.stop(errors.Wrapf(err, "burst of %d over simulated nodes", n))
		}
		r.Scale = append(r.Scale, s)
	}
	if o.Guests {
		if err := runGuest(ctx, o, r); err != nil {
			return r.stop(errors.Wrap(err, "real guest"))
		}
	}
	if o.Migration {
		mg, err := runMigration(ctx, o)
		if err != nil {
			return r.stop(errors.Wrap(err, "live migration"))
		}
		r.Migration = mg
	}
	if o.Idle {
		idle, err := runNode(ctx, o, idleSpec)
		if err != nil {
			return r.stop(errors.Wrap(err, "idle node"))
		}
		r.Idle = idle
	}
	for _, sp := range denseSpecs {
		if !o.runsNode(sp) {
			continue
		}
		dense, err := runNode(ctx, o, sp)
		if err != nil {
			return r.stop(errors.Wrapf(err, "dense node %s", sp.name))
		}
		r.DenseNodes = append(r.DenseNodes, *dense)
	}
	r.Targets = Targets(r)
	return r, nil
}

// stop ends r at err: the scenarios run until then, judged, and why the
// run ended there.
func (r *Result) stop(err error) (*Result, error) {
	r.Stopped = err.Error()
	r.Targets = Targets(r)
	return r, err
}

// Scenarios are the names Options.Only takes, in the order Run runs them.
var Scenarios = []string{"density", "bursts", "scale", "guest", "migration", "idle", denseSimulatedSpec.name, denseLibvirtSpec.name}

// Only keeps the scenarios named, of Scenarios, as o sizes them, and
// drops the others: `-only guest` runs the real guest alone, with its
// snapshots and backups.
func (o *Options) Only(names []string) error {
	keep := map[string]bool{}
	for _, n := range names {
		n = strings.TrimSpace(n)
		if !slices.Contains(Scenarios, n) {
			return errors.Errorf("no scenario %q: the scenarios are %s", n, strings.Join(Scenarios, ", "))
		}
		keep[n] = true
	}
	if !keep["density"] {
		o.Density = 0
	}
	if !keep["bursts"] {
		o.Sizes = nil
	}
	if !keep["scale"] {
		o.Scale = nil
	}
	o.Guests = o.Guests && keep["guest"]
	o.Migration = o.Migration && keep["migration"]
	o.Idle = o.Idle && keep["idle"]
	o.DenseSimulated = o.DenseSimulated && keep[denseSimulatedSpec.name]
	o.DenseLibvirt = o.DenseLibvirt && keep[denseLibvirtSpec.name]
	return nil
}

// runsNode says whether o runs the dense node sp.
func (o Options) runsNode(sp nodeSpec) bool {
	switch sp.name {
	case denseSimulatedSpec.name:
		return o.DenseSimulated
	case denseLibvirtSpec.name:
		return o.DenseLibvirt
	}
	return false
}

// scenarios says which scenarios o runs, for the result: a run of some
// of them says so.
func (o Options) scenarios() []string {
	var out []string
	if o.Density > 0 {
		out = append(out, fmt.Sprintf("density (%d VMs)", o.Density))
	}
	if len(o.Sizes) > 0 {
		out = append(out, fmt.Sprintf("bursts (%s VMs)", joinInts(o.Sizes)))
	}
	if len(o.Scale) > 0 {
		out = append(out, fmt.Sprintf("scale (%s VMs over simulated nodes)", joinInts(o.Scale)))
	}
	if o.Guests {
		parts := []string{"boot"}
		if o.Snapshots {
			parts = append(parts, "snapshots")
		}
		if o.Backups {
			parts = append(parts, "backups")
		}
		out = append(out, fmt.Sprintf("real guest (%s)", strings.Join(parts, ", ")))
	}
	if o.Migration {
		out = append(out, "live migration")
	}
	if o.Idle {
		out = append(out, "idle node")
	}
	for _, sp := range denseSpecs {
		if o.runsNode(sp) {
			out = append(out, fmt.Sprintf("dense node (%d guests, %s)", sp.observed, sp.driverName()))
		}
	}
	return out
}

func joinInts(ns []int) string {
	s := make([]string, len(ns))
	for i, n := range ns {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ", ")
}

type spec struct {
	name     string
	vms      int
	nodes    int
	interval time.Duration // 0: all at once
	limits   bool
	// simulated runs the nodes in one simnodes process, over the
	// in-memory driver, instead of an agent and a libvirtd each.
	simulated bool
}

// timeout bounds a scenario's wait for Running: generous, since a busy
// machine should produce a slow result rather than none.
func (s spec) timeout() time.Duration {
	return 2*time.Minute + time.Duration(s.vms)*(300*time.Millisecond+s.interval)
}

// startStack starts a scenario's stack in a directory of its own (so's
// Dir and Debug come from o) and returns it with that directory; stop
// stops it, and removes the directory unless the scenario failed or o
// keeps every one.
func startStack(ctx context.Context, o Options, prefix string, so stack.Options, progress func(string, ...any)) (s *stack.Stack, dir string, stop func(failed bool), err error) {
	if dir, err = os.MkdirTemp(o.Dir, prefix); err != nil {
		return nil, "", nil, errors.Wrap(err, "cannot create the stack directory")
	}
	so.Dir, so.Debug, so.Pprof = dir, o.Debug, o.Pprof
	progress("starting a stack of %d nodes in %s", len(so.Nodes), dir)
	if s, err = stack.Start(ctx, so); err != nil {
		return nil, "", nil, errors.Wrapf(err, "cannot start the stack (logs in %s/logs)", dir)
	}
	if o.Pprof {
		for _, name := range append([]string{"hub"}, prefixed("agent-", so.Nodes)...) {
			if addr := s.PprofAddress(name); addr != "" {
				progress("%s profiles: http://%s/debug/pprof/", name, addr)
			}
		}
	}
	return s, dir, func(failed bool) {
		s.Stop()
		if failed || o.Keep {
			progress("logs kept in %s/logs", dir)
			return
		}
		_ = os.RemoveAll(dir)
	}, nil
}

// prefixed is each of names after prefix.
func prefixed(prefix string, names []string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = prefix + n
	}
	return out
}

func runScenario(ctx context.Context, o Options, sp spec) (Scenario, error) {
	progress := func(format string, args ...any) {
		fmt.Fprintf(o.Progress, "%s %-12s %s\n", time.Now().Format("15:04:05"), sp.name, fmt.Sprintf(format, args...))
	}
	sc := Scenario{Name: sp.name, VMs: sp.vms, Nodes: sp.nodes, IntervalSeconds: sp.interval.Seconds()}
	nodes := make([]string, sp.nodes)
	for i := range nodes {
		nodes[i] = fmt.Sprintf("node%d", i+1)
	}
	so := stack.Options{Nodes: nodes}
	if sp.simulated {
		// A simulated host as large as one VM per vCPU needs, at the
		// default allocation ratios; one warm-up VM per node besides.
		so.Simulated, so.CPUAllocationRatio, so.MemoryAllocationRatio = true, defaultCPURatio, 1
		so.SimulatedHost = simulatedHost((sp.vms+sp.nodes+sp.nodes-1)/sp.nodes, defaultCPURatio)
		// NATS in a process of its own, whose memory is then its own;
		// it and the nodes ahead of the control plane for the CPU, as a
		// fleet's own machines would be.
		so.NATSProcess, so.FleetFirst = true, true
		// The hub under its goal as a container's memory limit, handed
		// to it as cluster/deploy does.
		if g, ok := goalOf(sp.vms); ok {
			so.HubMemoryLimit = int64(g.hubRSSMiB) << 20
			sc.Notes = append(sc.Notes, fmt.Sprintf("The hub ran with --memory-limit=%dMiB, its memory goal, as cluster/deploy hands it the container's limit: its Go runtime keeps under %.0f%% of it.", int64(g.hubRSSMiB), memlimit.Share*100))
		}
	} else {
		// One warm-up VM per node besides the measured ones.
		var notes []string
		so.CPUAllocationRatio, so.MemoryAllocationRatio, notes = allocationRatios(sp.vms+sp.nodes, sp.nodes)
		sc.Notes = append(sc.Notes, notes...)
	}
	s, _, stop, err := startStack(ctx, o, "vf-bench-", so, progress)
	if err != nil {
		return sc, err
	}
	failed := true
	defer func() { stop(failed) }()
	if err := measure(ctx, s, sp, &sc, progress); err != nil {
		return sc, err
	}
	failed = sc.Running != sc.VMs
	return sc, nil
}

func measure(ctx context.Context, s *stack.Stack, sp spec, sc *Scenario, progress func(string, ...any)) error {
	kube, err := newClient(s.ControlPlane.Config, s.ControlPlane.Client)
	if err != nil {
		return err
	}
	progress("creating the network and %d Volumes", sp.vms+sp.nodes)
	if err := fleetFor(sp.vms+sp.nodes).Prepare(ctx, kube, sp.vms+sp.nodes); err != nil {
		return err
	}
	progress("warming up: one VM per node")
	if err := warmUp(ctx, kube, sp.vms, sp.nodes); err != nil {
		return err
	}

	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	t := newTracker(sp.vms)
	if err := watchRunning(wctx, kube, t); err != nil {
		return err
	}
	before, err := FetchRequestCounts(ctx, s.ControlPlane.Config)
	if err != nil {
		return err
	}
	hubBefore, agentsBefore, err := usage(s, sp)
	if err != nil {
		return err
	}
	cpuBefore, err := snapshotCPU()
	if err != nil {
		return err
	}

	progress("creating %d VMs", sp.vms)
	start := time.Now()
	pctx, stopProgress := context.WithCancel(ctx)
	defer stopProgress()
	go t.report(pctx, start, progressEvery, progress)
	create := createTracked(kube, t)
	if sp.interval > 0 {
		err = paced(ctx, sp.vms, sp.interval, create)
	} else {
		err = workload.Parallel(ctx, sp.vms, creators, create)
	}
	if err != nil {
		return err
	}
	select {
	case <-t.done:
	case <-time.After(sp.timeout()):
		_, running := t.counts()
		sc.Notes = append(sc.Notes, fmt.Sprintf("timed out after %s with %d of %d VMs Running", sp.timeout(), running, sp.vms))
	case <-ctx.Done():
		return ctx.Err()
	}
	cpuAfter, err := snapshotCPU()
	if err != nil {
		return err
	}
	sc.CPU = cpuAfter.shareSince(cpuBefore)
	last := t.lastRunning()
	_, sc.Running = t.counts()
	sc.Latency = Summarise(t.latencies())
	hubPart, nodePart := t.split()
	sc.CreateToPlaced, sc.PlacedToRunning = Summarise(hubPart), Summarise(nodePart)
	sc.Stalls, sc.Timeline = t.stalls(start, stallWindow), t.timeline(start, time.Second)
	if sc.Running > 0 {
		sc.WallSeconds = last.Sub(start).Seconds()
		sc.VMsPerSecond = float64(sc.Running) / sc.WallSeconds
	}
	progress("%d of %d Running after %.2f s (p50 %.3f s, p99 %.3f s)", sc.Running, sp.vms, sc.WallSeconds, sc.Latency.P50, sc.Latency.P99)

	time.Sleep(settle)
	after, err := FetchRequestCounts(ctx, s.ControlPlane.Config)
	if err != nil {
		return err
	}
	hubAfter, agentsAfter, err := usage(s, sp)
	if err != nil {
		return err
	}
	stopWatch()
	if sc.Footprint, err = footprint(ctx, s, cpuAfter); err != nil {
		return err
	}
	ours := ourWrites(before, after)
	sc.VMWritesPerVM = ours.Resource("virtualmachines") / float64(sp.vms)
	sc.Writes = ours.Breakdown(sp.vms)
	sc.OtherRequests = otherRequests(before, after, ours, sp.vms)
	sc.HubPeakRSSBytes = hubAfter.PeakRSSBytes
	sc.HubCPUSeconds = hubAfter.CPUSeconds - hubBefore.CPUSeconds
	sc.HubCPUSecondsPer1000VM = sc.HubCPUSeconds / float64(sp.vms) * 1000
	sc.AgentPeakRSSBytes = agentsAfter[0].PeakRSSBytes
	sc.AgentCPUSeconds = agentsAfter[0].CPUSeconds - agentsBefore[0].CPUSeconds
	for _, a := range agentsAfter {
		sc.AgentMaxPeakRSSBytes = max(sc.AgentMaxPeakRSSBytes, a.PeakRSSBytes)
	}
	if sc.PerNode, sc.AddressedVMs, sc.DuplicateAddresses, err = spread(ctx, kube); err != nil {
		return err
	}
	if sp.simulated && sc.Running == sp.vms {
		// Every VM the hub knows: the burst's and the warm-up's, one per
		// node.
		known := sp.vms + sp.nodes
		// A restart that cannot be measured loses nothing of the burst.
		if sc.HubRestart, err = restartHub(ctx, s, kube, known, progress); err != nil {
			if ctx.Err() != nil {
				return err
			}
			sc.HubRestart = &HubRestart{VMs: known, Error: err.Error()}
			progress("the hub's restart could not be measured: %v", err)
		}
	}
	if !sp.limits || sc.Running == 0 {
		return nil
	}
	if sp.simulated {
		return simulatedLimit(ctx, s, sp, sc, progress)
	}
	return limits(ctx, s, sp, sc, progress)
}

// ourWrites are the writes between two snapshots that the benchmark
// counts as virtfleet's: to its group's resources and to events.
func ourWrites(before, after RequestCounts) Requests {
	ours := WritesBetween(before, after, v1alpha1.Group)
	for k, v := range WritesBetween(before, after, "") {
		if k.Resource == "events" {
			ours[k] = v
		}
	}
	return ours
}

// simulatedLimit measures the whole-flow limit on the stack a burst over
// simulated nodes just ran on, with the hub and the nodes stopped. There
// is no raw libvirt to measure, and the whole flow is the limit the
// bursts are judged against.
func simulatedLimit(ctx context.Context, s *stack.Stack, sp spec, sc *Scenario, progress func(string, ...any)) error {
	if err := s.StopHub(); err != nil {
		return err
	}
	if err := s.StopSimulated(); err != nil {
		return err
	}
	kube, err := newClient(s.ControlPlane.Config, s.ControlPlane.Client)
	if err != nil {
		return err
	}
	if err := measureWholeFlow(ctx, kube, sp, sc, progress); err != nil {
		return err
	}
	progress("virtfleet %.1f VMs/s; whole flow %.1f (%.0f%%)", sc.VMsPerSecond, sc.WholeFlow.VMsPerSecond, 100*sc.RatioToWholeFlow)
	return nil
}

// measureWholeFlow measures the whole-flow limit of sp's VMs and sc's
// rate against it, noting the burst's writes it does not replay.
func measureWholeFlow(ctx context.Context, kube client.Client, sp spec, sc *Scenario, progress func(string, ...any)) error {
	progress("whole flow: %d VMs × %d writes (VM, Volume, NetworkAddress), no hub or agent", sp.vms, wholeFlowWrites)
	wf, err := wholeFlow(ctx, kube, namespace, sp.vms)
	if err != nil {
		return errors.Wrap(err, "whole flow")
	}
	sc.WholeFlow, sc.RatioToWholeFlow = &wf, sc.VMsPerSecond/wf.VMsPerSecond
	if missing := unreplayed(append(slices.Clone(sc.Writes), sc.OtherRequests...)); len(missing) > 0 {
		sc.Notes = append(sc.Notes, "the whole-flow limit does not replay these writes of the burst: "+strings.Join(missing, ", "))
	}
	return nil
}

// limits measures both floors on the stack virtfleet just ran on, with the
// hub and the agents stopped so neither competes for the machine.
func limits(ctx context.Context, s *stack.Stack, sp spec, sc *Scenario, progress func(string, ...any)) error {
	if err := s.StopHub(); err != nil {
		return err
	}
	nodes := make([]string, 0, len(s.Nodes))
	for n := range s.Nodes {
		nodes = append(nodes, n)
	}
	slices.Sort(nodes)
	for _, n := range nodes {
		if err := s.StopAgent(n); err != nil {
			return err
		}
	}
	progress("raw go-libvirt: %d define+start over %d daemons", sp.vms, len(nodes))
	daemons := make([]*libvirttest.Node, 0, len(nodes))
	for _, n := range nodes {
		daemons = append(daemons, s.Nodes[n])
	}
	raw, restarted, err := rawLibvirt(ctx, daemons, sp.vms)
	if err != nil {
		return errors.Wrap(err, "raw libvirt")
	}
	if len(restarted) > 0 {
		sc.Notes = append(sc.Notes, fmt.Sprintf("libvirtd of %s was gone when its agent had stopped (libvirtd 9.0 segfaults now and then when a client with event callbacks disconnects; see dmesg) and was started again, fresh, for the raw-libvirt limit", strings.Join(restarted, ", ")))
	}
	sc.RawLibvirt, sc.RatioToRawLibvirt = &raw, sc.VMsPerSecond/raw.VMsPerSecond
	writes := int(math.Round(sc.VMWritesPerVM))
	progress("control plane: %d VMs × %d writes, no hub or agent", sp.vms, writes)
	kube, err := newClient(s.ControlPlane.Config, s.ControlPlane.Client)
	if err != nil {
		return err
	}
	cp, err := controlPlane(ctx, kube, namespace, sp.vms, writes)
	if err != nil {
		return errors.Wrap(err, "control plane")
	}
	sc.ControlPlane, sc.RatioToControlPlane = &cp, sc.VMsPerSecond/cp.VMsPerSecond
	if err := measureWholeFlow(ctx, kube, sp, sc, progress); err != nil {
		return err
	}
	progress("virtfleet %.1f VMs/s; raw libvirt %.1f (%.0f%%); control plane %.1f (%.0f%%); whole flow %.1f (%.0f%%)",
		sc.VMsPerSecond, raw.VMsPerSecond, 100*sc.RatioToRawLibvirt, cp.VMsPerSecond, 100*sc.RatioToControlPlane, sc.WholeFlow.VMsPerSecond, 100*sc.RatioToWholeFlow)
	return nil
}

// createTracked creates the fleet's VM i and tells t when its Create
// returned, where latency is measured from.
func createTracked(kube client.Client, t *tracker) func(ctx context.Context, i int) error {
	return func(ctx context.Context, i int) error {
		vm := fleet.VM(workload.VMName(i), workload.VolumeName(i))
		if err := kube.Create(ctx, vm); err != nil {
			return errors.Wrapf(err, "cannot create VirtualMachine %s", vm.Name)
		}
		t.markCreated(vm.Name, time.Now())
		return nil
	}
}

// paced starts do(i) every interval regardless of how long earlier calls
// take, so a slow Create does not stretch the schedule.
func paced(ctx context.Context, n int, interval time.Duration, do func(ctx context.Context, i int) error) error {
	errs := make(chan error, n)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for i := range n {
		if i > 0 {
			select {
			case <-tick.C:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		go func() { errs <- do(ctx, i) }()
	}
	var err error
	for range n {
		err = errors.Join(err, <-errs)
	}
	return err
}

// warmUp takes one VM per node to Running before the measurement: the first
// guest on a node also creates the network there, and the hub warms its
// caches. Placement is least-allocated, so the VMs land one per node. Their
// writes fall before the first snapshot. The warm-up VMs use the Volumes
// after the measured VMs' ones.
func warmUp(ctx context.Context, kube client.Client, first, nodes int) error {
	vms := make([]*v1alpha1.VirtualMachine, nodes)
	for i := range vms {
		vms[i] = fleet.VM(fmt.Sprintf("%s-%d", warmUpName, i), workload.VolumeName(first+i))
		if err := kube.Create(ctx, vms[i]); err != nil {
			return errors.Wrap(err, "cannot create a warm-up VM")
		}
	}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	return errors.Wrap(workload.WaitFor(wctx, 100*time.Millisecond, func() (bool, error) {
		for _, vm := range vms {
			if err := kube.Get(wctx, client.ObjectKeyFromObject(vm), vm); err != nil {
				return false, errors.Wrap(err, "cannot get a warm-up VM")
			}
			if vm.Status.AtProvider.Phase != v1alpha1.PhaseRunning {
				return false, nil
			}
		}
		return true, nil
	}), "the warm-up VMs did not reach Running")
}

// usage reads the hub's and every agent's counters; agents are in node
// order, node1 first. Simulated nodes are one process, the one agent.
func usage(s *stack.Stack, sp spec) (ProcessUsage, []ProcessUsage, error) {
	hub, err := ReadProcessUsage(s.HubPID())
	if err != nil {
		return ProcessUsage{}, nil, errors.Wrap(err, "hub")
	}
	if sp.simulated {
		sim, err := ReadProcessUsage(s.SimulatedPID())
		return hub, []ProcessUsage{sim}, errors.Wrap(err, "simulated nodes")
	}
	agents := make([]ProcessUsage, sp.nodes)
	for i := range sp.nodes {
		if agents[i], err = ReadProcessUsage(s.AgentPID(fmt.Sprintf("node%d", i+1))); err != nil {
			return ProcessUsage{}, nil, errors.Wrapf(err, "agent of node%d", i+1)
		}
	}
	return hub, agents, nil
}

// minOtherPerVM is the least per VM a request kind outside Writes needs to
// be listed among a scenario's OtherRequests; rarer ones are noise.
const minOtherPerVM = 0.1

// otherRequests breaks down the requests between the snapshots that are not
// in ours, leaving out those rarer than minOtherPerVM.
func otherRequests(before, after RequestCounts, ours Requests, vms int) []RequestCount {
	all := Between(before, after, func(k RequestKey) bool { _, mine := ours[k]; return !mine })
	var out []RequestCount
	for _, c := range all.Breakdown(vms) {
		if c.PerVM >= minOtherPerVM {
			out = append(out, c)
		}
	}
	return out
}

// allocationRatios are the agents' CPU and memory allocation ratios that
// make room for vms spread evenly over nodes, the defaults when those do,
// and a note for the report when they had to be raised.
func allocationRatios(vms, nodes int) (cpu, memory float64, notes []string) {
	perNode := (vms + nodes - 1) / nodes
	// Placement is least-allocated, not perfectly even: leave a little room.
	perNode += perNode/10 + 1
	cpu, memory = defaultCPURatio, defaultMemoryRatio
	needCPU := float64(perNode*workload.VCPU + testDomainVCPU)
	if c := math.Ceil(needCPU / hostCPUs); c > cpu {
		cpu = c
		notes = append(notes, fmt.Sprintf("agents' cpu-allocation-ratio raised from %d to %.0f: up to %d VMs of 1 vCPU per node need %.0f vCPUs, the test driver's host has %d CPUs", defaultCPURatio, cpu, perNode, needCPU, hostCPUs))
	}
	needMem := float64(int64(perNode)*(64<<20) + testDomainMemoryBytes)
	if m := math.Ceil(needMem / hostMemoryBytes); m > memory {
		memory = m
		notes = append(notes, fmt.Sprintf("agents' memory-allocation-ratio raised from %d to %.0f to fit %d VMs per node", defaultMemoryRatio, memory, perNode))
	}
	return cpu, memory, notes
}

// simulatedHost is a simulated node's host with room for perNode VMs of
// the workload's size at cpuRatio vCPUs per host CPU and no memory
// overcommit, and a tenth to spare: placement is least-allocated, not
// perfectly even.
func simulatedHost(perNode int, cpuRatio int) stack.SimulatedHost {
	perNode += perNode/10 + 1
	memory := resource.MustParse(workload.Memory)
	return stack.SimulatedHost{
		VCPUs:       int64((perNode*workload.VCPU + cpuRatio - 1) / cpuRatio),
		MemoryBytes: int64(perNode) * memory.Value(),
	}
}

// ThisMachine describes the machine a run is made on, its load included.
func ThisMachine() Machine {
	m := Machine{CPUs: runtime.NumCPU(), GoVersion: runtime.Version()}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		m.MemoryBytes, _ = parseStatusKiB(string(b), "MemTotal")
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		if f := strings.Fields(string(b)); len(f) >= 3 {
			m.LoadAvgBefore = strings.Join(f[:3], " ")
		}
	}
	return m
}

// Commit is the tree's HEAD and whether it has uncommitted changes.
func Commit() (string, bool) {
	root := controlplane.RepoRoot()
	out, err := exec.Command("git", "-C", root, "rev-parse", "HEAD").Output()
	if err != nil {
		return "unknown", false
	}
	status, _ := exec.Command("git", "-C", root, "status", "--porcelain").Output()
	return strings.TrimSpace(string(out)), len(strings.TrimSpace(string(status))) > 0
}
