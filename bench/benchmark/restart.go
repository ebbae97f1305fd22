package benchmark

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/reconciler/managed"
	dto "github.com/prometheus/client_model/go"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/harness/stack"
)

// The hub restarted at scale (issue 57): killed as a crash or an eviction
// kills it, once every VM of a burst over simulated nodes runs, and
// started again. The new hub lists every object and reconciles every VM
// once; with nothing changed it should find nothing to write.
const (
	// targetRestartSeconds bounds the time from the kill until the new hub
	// has observed every VM once and its queue is empty.
	targetRestartSeconds = 300.0
	// targetRestartWritesPerVM bounds the API writes from the kill until
	// then, per VM.
	targetRestartWritesPerVM = 0.05
	// restartTimeout ends a restart that never finishes its pass.
	restartTimeout = 10 * time.Minute
)

// vmController is the hub's VirtualMachine controller, as
// controller-runtime names it in its metrics.
var vmController = managed.ControllerName(v1alpha1.VirtualMachineGroupKind)

// vmObserves counts the hub's observes of VMs (internal/metrics).
const vmObserves = "virtfleet_hub_vm_observes_total"

// HubRestart is a burst's hub killed (SIGKILL) once its VMs all ran, and
// started again.
type HubRestart struct {
	// VMs the new hub had to reconcile: the burst's and the warm-up's.
	VMs int `json:"vms"`
	// Seconds from the kill until the new hub had observed VMs VMs
	// (virtfleet_hub_vm_observes_total: reconciles past its rate limit)
	// and its VM queue was empty; TimedOut if that did not come within
	// restartTimeout.
	Seconds  float64 `json:"seconds"`
	TimedOut bool    `json:"timedOut,omitempty"`
	// Observes are those the new hub made by then.
	Observes float64 `json:"observes"`
	// WritesPerVM are the writes to virtfleet's kinds and to events from
	// the kill until then (and settle), per VM; Writes breaks them down.
	WritesPerVM float64        `json:"writesPerVM"`
	Writes      []RequestCount `json:"writes,omitempty"`
	// Changed counts the fields the writes changed, by kind and path,
	// over the VMs and Volumes written; EventReasons the events recorded
	// meanwhile, by their object's kind and reason. They say what a write
	// the new hub made was for.
	Changed      map[string]int `json:"changed,omitempty"`
	EventReasons map[string]int `json:"eventReasons,omitempty"`
	// Error, if set, is why the restart could not be measured; the
	// burst's own figures stand.
	Error string `json:"error,omitempty"`
}

// restartHub kills the hub of s, whose vms VMs all run, starts it again
// and measures the new hub's first pass over them (HubRestart).
func restartHub(ctx context.Context, s *stack.Stack, kube client.Client, vms int, progress func(string, ...any)) (*HubRestart, error) {
	objects, err := snapshotObjects(ctx, kube)
	if err != nil {
		return nil, err
	}
	before, err := FetchRequestCounts(ctx, s.ControlPlane.Config)
	if err != nil {
		return nil, err
	}
	progress("killing the hub (SIGKILL) with %d VMs Running, and starting it again", vms)
	s.KillHub()
	start := time.Now()
	if err := s.StartHub(); err != nil {
		return nil, err
	}
	r := &HubRestart{VMs: vms}
	url := s.HubMetricsURL()
	deadline := time.Now().Add(restartTimeout)
	for {
		q, err := scrapeMetrics(ctx, nil, url, "the hub", parseQueue)
		if err == nil {
			r.Observes = q.observes
			if q.observes >= float64(vms) && q.depth == 0 {
				break
			}
		}
		if time.Now().After(deadline) {
			r.TimedOut = true
			break
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
	r.Seconds = time.Since(start).Seconds()
	progress("new hub observed %.0f VMs, its queue empty, %.1f s after the kill", r.Observes, r.Seconds)
	time.Sleep(settle)
	after, err := FetchRequestCounts(ctx, s.ControlPlane.Config)
	if err != nil {
		return nil, err
	}
	writes := ourWrites(before, after)
	r.WritesPerVM = writes.Total() / float64(vms)
	r.Writes = writes.Breakdown(vms)
	now, err := snapshotObjects(ctx, kube)
	if err != nil {
		return nil, err
	}
	if r.Changed, err = changedFields(objects, now); err != nil {
		return nil, err
	}
	var warnings map[string]string
	if r.EventReasons, warnings, err = eventReasons(ctx, kube, start); err != nil {
		return nil, err
	}
	progress("the new hub changed %v; events %v", r.Changed, r.EventReasons)
	for k, m := range warnings {
		progress("a warning %s: %s", k, m)
	}
	return r, nil
}

// queue is what the hub's metrics say of its VirtualMachine controller:
// the VMs it observed and its queue's depth.
type queue struct {
	observes, depth float64
}

// parseQueue reads a queue out of the Prometheus text exposition format:
// the hub's virtfleet_hub_vm_observes_total and controller-runtime's
// workqueue_depth of vmController. A reconcile the hub's rate limit
// deferred is one of controller-runtime's reconciles but no observe.
func parseQueue(r io.Reader) (queue, error) {
	families, err := metricFamilies(r)
	if err != nil {
		return queue{}, errors.Wrap(err, "cannot parse the hub's metrics")
	}
	var q queue
	ofController := func(m *dto.Metric) bool {
		return label(m, "controller") == vmController || label(m, "name") == vmController
	}
	for _, m := range families[vmObserves].GetMetric() {
		q.observes += m.GetCounter().GetValue()
	}
	found := false
	for _, m := range families["workqueue_depth"].GetMetric() {
		if ofController(m) {
			q.depth += m.GetGauge().GetValue()
			found = true
		}
	}
	if !found {
		return q, errors.Errorf("the hub's metrics have no workqueue_depth of %s", vmController)
	}
	return q, nil
}

// restartSeconds says how long r's pass took, that it did not end, or
// that it could not be measured.
func restartSeconds(r *HubRestart) string {
	if r.Error != "" {
		return "not measured: " + r.Error
	}
	if r.TimedOut {
		return fmt.Sprintf("not within %.0f s (%.0f of %d VMs observed)", r.Seconds, r.Observes, r.VMs)
	}
	return fmt.Sprintf("%.1f s (%.0f observes of %d VMs)", r.Seconds, r.Observes, r.VMs)
}
