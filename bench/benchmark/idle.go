package benchmark

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"strings"
	"time"

	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/bench/workload"
	"github.com/virtfleet/virtfleet/internal/harness/stack"
)

// The idle node (issue 40) and the dense nodes (issue 57): one node of many
// guests, whose agent's full observe is timed by the agent itself, then
// some of them left alone for a window while the agent's CPU time is
// counted. Idle nodes are most of a fleet, and what an agent does while
// nothing changes (heartbeats, resyncs, watches) is paid by every one of
// them the whole time; a dense node is where that cost grows with the
// guests.
const (
	idleNode = "node1"
	// idleResyncs is how many of the agent's periodic resyncs of the
	// observed guests are timed.
	idleResyncs = 2
	// agentResyncEvery is the agent's default resync interval, which the
	// scenario keeps: the idle cost is the default agent's.
	agentResyncEvery = time.Minute

	targetFullObserveSeconds = 1.0
	targetIdleCoreShare      = 0.01
)

// nodeSpec is one node of many guests as a scenario measures it.
type nodeSpec struct {
	// name is the scenario's (Scenarios, the progress).
	name string
	// simulated serves the node from simnodes over the in-memory driver
	// (agent/driver/fake), as the bursts over simulated nodes do; else it
	// is an agent on the real libvirt driver over its own libvirtd on the
	// test driver.
	simulated bool
	// observed guests are Running while the resyncs are timed; idle of
	// them are left for the window, the others deleted first.
	observed, idle int
	window         time.Duration
}

// The node scenarios: issue 40's idle node, and issue 57's 1,000 guests on
// a simulated node and 500 domains on the test driver.
var (
	idleSpec           = nodeSpec{name: "idle", observed: 200, idle: 100, window: 5 * time.Minute}
	denseSimulatedSpec = nodeSpec{name: "dense-simulated", simulated: true, observed: 1000, idle: 1000, window: 5 * time.Minute}
	denseLibvirtSpec   = nodeSpec{name: "dense-libvirt", observed: 500, idle: 500, window: 3 * time.Minute}
	denseSpecs         = []nodeSpec{denseSimulatedSpec, denseLibvirtSpec}
)

// driverName says which driver a node of sp runs, for the report.
func (sp nodeSpec) driverName() string {
	if sp.simulated {
		return driverSimulated
	}
	return driverTest
}

// The drivers a node scenario's agent runs, as Idle.Driver names them.
const (
	driverSimulated = "simulated"
	driverTest      = "test driver"
)

// Idle is what a node scenario (the idle node, a dense node) measured.
type Idle struct {
	// Scenario is the scenario's name; empty in results from before
	// there was more than the idle node.
	Scenario string `json:"scenario,omitempty"`
	// Driver is what the agent's guests ran on: driverSimulated (simnodes
	// over the in-memory driver) or driverTest (the real libvirt driver
	// over libvirtd's test driver); empty means the test driver.
	Driver string `json:"driver,omitempty"`
	Node   string `json:"node"`
	// ObservedVMs are the node's guests while its full observe was timed.
	ObservedVMs int `json:"observedVMs"`
	// Resyncs is how many of the agent's periodic resyncs were timed, each
	// a full observe of the node: the driver's listing of its orphans and
	// guests, which the agent times; the guests the listing shows as their
	// intents ask are then reported from it, with no driver call of their
	// own (EnsuresPerResync counts the calls there were).
	Resyncs int `json:"resyncs"`
	// FullObserveSeconds is their mean, from the agent's
	// virtfleet_agent_resync_duration_seconds; FullObserveAtMostSeconds
	// the upper bound of the histogram's bucket the slowest fell in.
	FullObserveSeconds       float64 `json:"fullObserveSeconds"`
	FullObserveAtMostSeconds float64 `json:"fullObserveAtMostSeconds"`
	// FullObserveRatio is FullObserveSeconds to the limit.
	FullObserveRatio float64 `json:"fullObserveRatio"`
	// EnsuresPerResync are the agent's Ensure calls meanwhile, per resync,
	// whatever asked for them (a resync, an intent the hub wrote again, a
	// driver event): the per-guest work left while nothing changes.
	EnsuresPerResync float64 `json:"ensuresPerResync"`
	// ResyncWindowSeconds is the time the resyncs were timed over, from
	// the first sample to the one that showed the last; the agent spent
	// ResyncWindowCPUSeconds of CPU then (its heartbeats, the Ensure
	// calls, the reports and the benchmark's scrapes of its metrics, once
	// a second, included).
	ResyncWindowSeconds    float64 `json:"resyncWindowSeconds,omitempty"`
	ResyncWindowCPUSeconds float64 `json:"resyncWindowCPUSeconds,omitempty"`
	// AgentPeakRSSBytes is the agent process's peak resident memory by
	// the end of the idle window.
	AgentPeakRSSBytes int64 `json:"agentPeakRSSBytes,omitempty"`

	// IdleVMs are the node's guests while it was idle: the others were
	// deleted after the full observe was timed.
	IdleVMs     int     `json:"idleVMs"`
	IdleSeconds float64 `json:"idleSeconds"`
	// AgentCPUSeconds is the agent's user and system time while idle;
	// AgentCoreShare that over IdleSeconds, the share of one core.
	AgentCPUSeconds float64 `json:"agentCPUSeconds"`
	AgentCoreShare  float64 `json:"agentCoreShare"`
	// IdleRatio is AgentCoreShare to the limit.
	IdleRatio float64 `json:"idleRatio"`
	// IdleResyncs and IdleEnsures are the agent's resyncs and Ensure calls
	// while idle.
	IdleResyncs int     `json:"idleResyncs"`
	IdleEnsures float64 `json:"idleEnsures"`
	// LoadAvg is the machine's load average at the end of the idle window:
	// other work on the machine slows the agent's too.
	LoadAvg string   `json:"loadAvg,omitempty"`
	Notes   []string `json:"notes,omitempty"`
}

// agentSample is what the idle scenario reads of an agent's metrics at one
// moment.
type agentSample struct {
	// resyncs and resyncSeconds are the resync histogram's count and sum;
	// resyncBuckets its cumulative counts by upper bound.
	resyncs       float64
	resyncSeconds float64
	resyncBuckets map[float64]float64
	// ensures counts the agent's Ensure calls, whatever their result.
	ensures float64
}

// The agent's histograms the idle scenario reads (internal/metrics).
const (
	resyncMetric      = "virtfleet_agent_resync_duration_seconds"
	driverCallsMetric = "virtfleet_agent_driver_call_duration_seconds"
)

// parseAgentSample reads an agentSample out of the Prometheus text
// exposition format.
func parseAgentSample(r io.Reader) (agentSample, error) {
	families, err := metricFamilies(r)
	if err != nil {
		return agentSample{}, errors.Wrap(err, "cannot read the agent's metrics")
	}
	s := agentSample{resyncBuckets: map[float64]float64{}}
	for _, m := range families[resyncMetric].GetMetric() {
		h := m.GetHistogram()
		s.resyncs, s.resyncSeconds = float64(h.GetSampleCount()), h.GetSampleSum()
		for _, b := range h.GetBucket() {
			s.resyncBuckets[b.GetUpperBound()] = float64(b.GetCumulativeCount())
		}
		// The histogram's +Inf bucket is its count.
		s.resyncBuckets[math.Inf(1)] = s.resyncs
	}
	for _, m := range families[driverCallsMetric].GetMetric() {
		if label(m, "operation") == "ensure" {
			s.ensures += float64(m.GetHistogram().GetSampleCount())
		}
	}
	return s, nil
}

// resyncsBetween are the resyncs between two samples: how many, their mean
// duration, and the upper bound of the lowest bucket that holds every one
// of them (+Inf when only that one does).
func resyncsBetween(before, after agentSample) (n int, mean, atMost float64) {
	d := after.resyncs - before.resyncs
	if d <= 0 {
		return 0, 0, 0
	}
	atMost = math.Inf(1)
	for le, c := range after.resyncBuckets {
		if c-before.resyncBuckets[le] >= d && le < atMost {
			atMost = le
		}
	}
	return int(d), (after.resyncSeconds - before.resyncSeconds) / d, atMost
}

// sampleAgent reads node's agent's metrics.
func sampleAgent(ctx context.Context, s *stack.Stack, node string) (agentSample, error) {
	return scrapeMetrics(ctx, nil, s.AgentMetricsURL(node), node+"'s agent", parseAgentSample)
}

// scrapeMetrics reads the metrics whose serves at url with hc (the default
// client when nil) and parses them.
func scrapeMetrics[T any](ctx context.Context, hc *http.Client, url, whose string, parse func(io.Reader) (T, error)) (T, error) {
	var zero T
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return zero, errors.Wrap(err, "cannot make the metrics request")
	}
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		return zero, errors.Wrapf(err, "cannot read the metrics of %s", whose)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return zero, errors.Errorf("the metrics of %s: %s", whose, resp.Status)
	}
	return parse(resp.Body)
}

// runNode runs the node scenario sp on a stack of its own.
func runNode(ctx context.Context, o Options, sp nodeSpec) (*Idle, error) {
	progress := func(format string, args ...any) {
		fmt.Fprintf(o.Progress, "%s %-12s %s\n", time.Now().Format("15:04:05"), sp.name, fmt.Sprintf(format, args...))
	}
	r := &Idle{Scenario: sp.name, Driver: sp.driverName(), Node: idleNode, ObservedVMs: sp.observed, IdleVMs: sp.idle}
	so := stack.Options{Nodes: []string{idleNode}}
	if sp.simulated {
		so.Simulated, so.CPUAllocationRatio, so.MemoryAllocationRatio = true, defaultCPURatio, 1
		so.SimulatedHost = simulatedHost(sp.observed, defaultCPURatio)
	} else {
		so.CPUAllocationRatio, so.MemoryAllocationRatio, r.Notes = allocationRatios(sp.observed, 1)
	}
	s, _, stop, err := startStack(ctx, o, "vf-bench-"+sp.name+"-", so, progress)
	if err != nil {
		return nil, err
	}
	failed := true
	defer func() { stop(failed) }()
	kube, err := newClient(s.ControlPlane.Config, s.ControlPlane.Client)
	if err != nil {
		return nil, err
	}

	progress("creating the network, %d Volumes and %d VMs", sp.observed, sp.observed)
	if err := fleet.Prepare(ctx, kube, sp.observed); err != nil {
		return nil, err
	}
	if err := idleFleet(ctx, kube, sp.observed); err != nil {
		return nil, err
	}

	progress("all %d Running; timing %d of the agent's resyncs (every %.0f s)", sp.observed, idleResyncs, agentResyncEvery.Seconds())
	pid := agentPID(s, sp)
	cpuBefore, err := ReadProcessUsage(pid)
	if err != nil {
		return nil, err
	}
	before, err := sampleAgent(ctx, s, idleNode)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	after, err := awaitResyncs(ctx, s, before, idleResyncs)
	if err != nil {
		return nil, err
	}
	cpuAfter, err := ReadProcessUsage(pid)
	if err != nil {
		return nil, err
	}
	r.ResyncWindowSeconds, r.ResyncWindowCPUSeconds = time.Since(start).Seconds(), cpuAfter.CPUSeconds-cpuBefore.CPUSeconds
	var n int
	n, r.FullObserveSeconds, r.FullObserveAtMostSeconds = resyncsBetween(before, after)
	r.Resyncs, r.FullObserveRatio = n, r.FullObserveSeconds/targetFullObserveSeconds
	r.EnsuresPerResync = (after.ensures - before.ensures) / float64(n)
	progress("full observe of %d guests: %.3f s mean over %d resyncs, each ≤ %g s; %.1f Ensure calls per resync; agent CPU %.3f s in %.0f s", sp.observed, r.FullObserveSeconds, n, r.FullObserveAtMostSeconds, r.EnsuresPerResync, r.ResyncWindowCPUSeconds, r.ResyncWindowSeconds)

	if sp.idle < sp.observed {
		progress("deleting %d VMs", sp.observed-sp.idle)
		if err := deleteVMs(ctx, kube, sp.idle, sp.observed); err != nil {
			return nil, err
		}
		// The window starts after a resync that found the node as it
		// stays.
		settledAt, err := sampleAgent(ctx, s, idleNode)
		if err != nil {
			return nil, err
		}
		if _, err := awaitResyncs(ctx, s, settledAt, 1); err != nil {
			return nil, err
		}
	}

	progress("idle with %d guests for %s", sp.idle, sp.window)
	if err := idleMeasure(ctx, s, sp, r); err != nil {
		return nil, err
	}
	progress("agent CPU %.3f s in %.0f s: %.3f%% of a core; %d resyncs, %.0f Ensure calls", r.AgentCPUSeconds, r.IdleSeconds, 100*r.AgentCoreShare, r.IdleResyncs, r.IdleEnsures)
	failed = false
	return r, nil
}

// agentPID is the process of the node's agent: simnodes, serving the one
// node, when it is simulated.
func agentPID(s *stack.Stack, sp nodeSpec) int {
	if sp.simulated {
		return s.SimulatedPID()
	}
	return s.AgentPID(idleNode)
}

// idleFleet creates the scenario's VMs and waits until every one is
// Running.
func idleFleet(ctx context.Context, kube client.WithWatch, vms int) error {
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	t := newTracker(vms)
	if err := watchRunning(wctx, kube, t); err != nil {
		return err
	}
	if err := workload.Parallel(ctx, vms, creators, createTracked(kube, t)); err != nil {
		return err
	}
	wait := spec{vms: vms}.timeout()
	select {
	case <-t.done:
		return nil
	case <-time.After(wait):
		_, running := t.counts()
		return errors.Errorf("%d of %d VMs Running after %s", running, vms, wait)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// awaitResyncs waits until node's agent made n resyncs since the sample
// since, and returns the sample that shows them.
func awaitResyncs(ctx context.Context, s *stack.Stack, since agentSample, n int) (agentSample, error) {
	wctx, cancel := context.WithTimeout(ctx, time.Duration(n+1)*agentResyncEvery)
	defer cancel()
	var last agentSample
	err := workload.WaitFor(wctx, time.Second, func() (bool, error) {
		var err error
		last, err = sampleAgent(wctx, s, idleNode)
		return err == nil && last.resyncs-since.resyncs >= float64(n), err
	})
	return last, errors.Wrapf(err, "the agent made no %d resyncs", n)
}

// deleteVMs deletes the VMs numbered [from, to) and waits until they are
// gone: their guests deleted on the node.
func deleteVMs(ctx context.Context, kube client.Client, from, to int) error {
	err := workload.Parallel(ctx, to-from, creators, func(ctx context.Context, i int) error {
		vm := &v1alpha1.VirtualMachine{}
		vm.Namespace, vm.Name = namespace, workload.VMName(from+i)
		return errors.Wrapf(client.IgnoreNotFound(kube.Delete(ctx, vm)), "cannot delete VirtualMachine %s", vm.Name)
	})
	if err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, spec{vms: to - from}.timeout())
	defer cancel()
	return errors.Wrap(workload.WaitFor(wctx, time.Second, func() (bool, error) {
		for i := from; i < to; i++ {
			vm := &v1alpha1.VirtualMachine{}
			err := kube.Get(wctx, client.ObjectKey{Namespace: namespace, Name: workload.VMName(i)}, vm)
			switch {
			case kerrors.IsNotFound(err):
				continue
			case err != nil:
				return false, errors.Wrap(err, "cannot get a deleted VM")
			}
			return false, nil
		}
		return true, nil
	}), "the deleted VMs are not gone")
}

// idleMeasure counts the agent's CPU time, resyncs and Ensure calls over
// sp's window into r. The window is the measurement, not a wait for
// anything.
func idleMeasure(ctx context.Context, s *stack.Stack, sp nodeSpec, r *Idle) error {
	pid := agentPID(s, sp)
	before, err := ReadProcessUsage(pid)
	if err != nil {
		return err
	}
	m0, err := sampleAgent(ctx, s, idleNode)
	if err != nil {
		return err
	}
	start := time.Now()
	select {
	case <-time.After(sp.window):
	case <-ctx.Done():
		return ctx.Err()
	}
	after, err := ReadProcessUsage(pid)
	if err != nil {
		return err
	}
	r.IdleSeconds = time.Since(start).Seconds()
	m1, err := sampleAgent(ctx, s, idleNode)
	if err != nil {
		return err
	}
	if pid != agentPID(s, sp) {
		return errors.New("the agent restarted during the idle window")
	}
	r.AgentPeakRSSBytes = after.PeakRSSBytes
	r.AgentCPUSeconds = after.CPUSeconds - before.CPUSeconds
	r.AgentCoreShare = r.AgentCPUSeconds / r.IdleSeconds
	r.IdleRatio = r.AgentCoreShare / targetIdleCoreShare
	r.IdleResyncs = int(m1.resyncs - m0.resyncs)
	r.IdleEnsures = m1.ensures - m0.ensures
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		if f := strings.Fields(string(b)); len(f) >= 3 {
			r.LoadAvg = strings.Join(f[:3], " ")
		}
	}
	return nil
}

// idleTargets are the targets of a node scenario: issue 40's and issue 57's
// full observe and idle CPU, or for the dense node on the test driver issue
// 57's "all Running, the resync's cost reported", with the same limits'
// ratios beside.
func idleTargets(r *Idle) []Target {
	if r == nil {
		return nil
	}
	driver := cmp.Or(r.Driver, driverTest)
	if r.Scenario == denseLibvirtSpec.name {
		return []Target{{
			Name: fmt.Sprintf("a real node's density: %d domains on one node (%s): all Running, the agent's resync cost", r.ObservedVMs, driver),
			Goal: "all Running; reported",
			Measured: fmt.Sprintf("%d of %d Running; full observe %.3f s, mean of %d, each ≤ %g s (%.3f× the %.0f s limit); agent CPU idle with %d, %.3f %% of a core (%.2f× the %.0f %% limit); peak RSS %.1f MiB",
				r.ObservedVMs, r.ObservedVMs, r.FullObserveSeconds, r.Resyncs, r.FullObserveAtMostSeconds, r.FullObserveRatio, targetFullObserveSeconds,
				r.IdleVMs, 100*r.AgentCoreShare, r.IdleRatio, 100*targetIdleCoreShare, mib(r.AgentPeakRSSBytes)),
			Met: r.Resyncs > 0 && r.IdleSeconds > 0,
		}}
	}
	return []Target{{
		Name:     fmt.Sprintf("one node of %d guests (%s): a full observe (the agent's resync)", r.ObservedVMs, driver),
		Goal:     fmt.Sprintf("≤ %.0f s", targetFullObserveSeconds),
		Measured: fmt.Sprintf("%.3f s, mean of %d, each ≤ %g s (%.3f× the limit)", r.FullObserveSeconds, r.Resyncs, r.FullObserveAtMostSeconds, r.FullObserveRatio),
		Met:      r.Resyncs > 0 && r.FullObserveSeconds <= targetFullObserveSeconds && r.FullObserveAtMostSeconds <= targetFullObserveSeconds,
	}, {
		Name:     fmt.Sprintf("an idle agent with %d guests (%s): CPU over %.0f min", r.IdleVMs, driver, r.IdleSeconds/60),
		Goal:     fmt.Sprintf("≤ %.0f %% of a core", 100*targetIdleCoreShare),
		Measured: fmt.Sprintf("%.3f %% (%.2f× the limit)", 100*r.AgentCoreShare, r.IdleRatio),
		Met:      r.IdleSeconds > 0 && r.AgentCoreShare <= targetIdleCoreShare,
	}}
}

// idleMarkdown is a node scenario's section of the report.
func idleMarkdown(p func(string, ...any), r *Idle) {
	if r == nil {
		return
	}
	node := fmt.Sprintf("its agent on the real libvirt driver over its own libvirtd on the test driver, with the agent's default 2 s heartbeat and %.0f s resync", agentResyncEvery.Seconds())
	if r.Driver == driverSimulated {
		node = fmt.Sprintf("served alone by simnodes, as the bursts over simulated nodes are: a whole agent (the real wire, reconciler, heartbeat and lease) over the in-memory driver, agent/driver/fake, with the agent's default 2 s heartbeat and %.0f s resync; the agent's CPU and memory are the simnodes process's", agentResyncEvery.Seconds())
	}
	if r.Scenario == "" || r.Scenario == idleSpec.name {
		p("## Idle node")
	} else {
		p("## Dense node: %d guests (%s)", r.ObservedVMs, cmp.Or(r.Driver, driverTest))
	}
	p("")
	p("One node (%s, %s) with %d VMs Running. The agent times each resync itself (`%s`): a full observe of the node, the driver listing its orphans and guests; the guests the listing shows as their intents ask are then reported from it, with no driver call of their own (the Ensure calls per resync count those there were).",
		r.Node, node, r.ObservedVMs, resyncMetric)
	if r.IdleVMs < r.ObservedVMs {
		p("Then %d of the VMs are deleted and the agent, left with %d guests, is idle for %.0f s while its CPU time is read from /proc.", r.ObservedVMs-r.IdleVMs, r.IdleVMs, r.IdleSeconds)
	} else {
		p("Then the agent, with the same guests, is idle for %.0f s while its CPU time is read from /proc.", r.IdleSeconds)
	}
	p("")
	p("| measure | value | limit | ratio |")
	p("| --- | --- | --- | --- |")
	p("| full observe of %d guests (mean of %d resyncs; each ≤ %g s) | %.3f s | %.0f s | %.3f |", r.ObservedVMs, r.Resyncs, r.FullObserveAtMostSeconds, r.FullObserveSeconds, targetFullObserveSeconds, r.FullObserveRatio)
	p("| Ensure calls per resync, any cause, with %d guests | %.1f | | |", r.ObservedVMs, r.EnsuresPerResync)
	if r.ResyncWindowSeconds > 0 {
		p("| agent CPU while the resyncs were timed (heartbeats, Ensure calls, reports and the benchmark's scrapes included) | %.3f s in %.0f s = %.3f %% of a core | | |", r.ResyncWindowCPUSeconds, r.ResyncWindowSeconds, 100*r.ResyncWindowCPUSeconds/r.ResyncWindowSeconds)
	}
	p("| agent CPU idle with %d guests | %.3f s in %.0f s = %.3f %% of a core | %.0f %% | %.3f |", r.IdleVMs, r.AgentCPUSeconds, r.IdleSeconds, 100*r.AgentCoreShare, 100*targetIdleCoreShare, r.IdleRatio)
	p("| resyncs, Ensure calls while idle | %d, %.0f | | |", r.IdleResyncs, r.IdleEnsures)
	if r.AgentPeakRSSBytes > 0 {
		p("| agent peak RSS | %.1f MiB | | |", mib(r.AgentPeakRSSBytes))
	}
	if r.LoadAvg != "" {
		p("| machine load average at the end | %s | | |", r.LoadAvg)
	}
	if len(r.Notes) > 0 {
		p("")
		notes(p, r.Notes)
	}
	p("")
}
