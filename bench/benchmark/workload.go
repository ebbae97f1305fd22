package benchmark

import (
	"context"
	"net/netip"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	watchtools "k8s.io/client-go/tools/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/bench/workload"
)

// The benchmark's workload (bench/workload) lives in its own namespace.
const (
	namespace = "bench"
	// creators is how many Create calls are in flight at once in a burst:
	// enough that the API server, not the client, is what the burst waits on.
	creators = 32
	// warmUpName prefixes the VMs taken to Running before the measurement.
	warmUpName = "warm-up"
)

var fleet = workload.Fleet{Namespace: namespace, Network: "bench-net", CIDR: "10.20.0.0/16", Creators: creators}

// fleetFor is fleet with a network that holds n VMs' addresses: its /16, or
// the smallest larger prefix from the same address when n VMs need more.
// A subnet gives its VMs every address but its network, gateway and
// broadcast ones (hub/internal/ipam).
func fleetFor(n int) workload.Fleet {
	const reserved = 3
	p := netip.MustParsePrefix(fleet.CIDR)
	bits := p.Bits()
	for bits > 8 && 1<<(32-bits)-reserved < n {
		bits--
	}
	f := fleet
	f.CIDR = netip.PrefixFrom(p.Addr(), bits).Masked().String()
	return f
}

// newClient is a client of its own, without client-side rate limiting, so
// that the benchmark's own requests are never what it measures.
func newClient(cfg *rest.Config, c client.Client) (client.WithWatch, error) {
	cfg = rest.CopyConfig(cfg)
	cfg.QPS, cfg.Burst = -1, 0
	cl, err := client.NewWithWatch(cfg, client.Options{Scheme: c.Scheme()})
	return cl, errors.Wrap(err, "cannot create the benchmark's client")
}

// tracker records when each VM's Create call returned and when a watch on
// VirtualMachines first showed it Running. creationTimestamp has a
// resolution of one second, too coarse for a 0.5 s target, so the start of
// each latency is taken on the client.
type tracker struct {
	mu      sync.Mutex
	want    int
	created map[string]time.Time
	running map[string]time.Time
	// scheduled is when a VM was first seen with its node annotation: the
	// hub has placed it and publishes its intent next; from there on the
	// time is mostly the agent's and the report's way back.
	scheduled map[string]time.Time
	done      chan struct{}
}

func newTracker(want int) *tracker {
	return &tracker{want: want, created: map[string]time.Time{}, running: map[string]time.Time{}, scheduled: map[string]time.Time{}, done: make(chan struct{})}
}

func (t *tracker) markCreated(name string, at time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.created[name] = at
	t.check()
}

func (t *tracker) markRunning(name string, at time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, seen := t.running[name]; seen {
		return
	}
	t.running[name] = at
	t.check()
}

func (t *tracker) markScheduled(name string, at time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, seen := t.scheduled[name]; !seen {
		t.scheduled[name] = at
	}
}

// split divides each latency into create→placed (the hub's part) and
// placed→Running (the intent's way to the agent, the agent's work and the
// report's way back to status).
func (t *tracker) split() (hub, node []time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for name, s := range t.scheduled {
		c, created := t.created[name]
		r, running := t.running[name]
		if created && running {
			hub = append(hub, max(0, s.Sub(c)))
			node = append(node, max(0, r.Sub(s)))
		}
	}
	return hub, node
}

func (t *tracker) check() {
	if len(t.created) == t.want && len(t.running) == t.want {
		select {
		case <-t.done:
		default:
			close(t.done)
		}
	}
}

// latencies are create→Running per VM. A watch event can be read before the
// Create call that caused it returns; such a VM counts as zero, not negative.
func (t *tracker) latencies() []time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]time.Duration, 0, len(t.running))
	for name, r := range t.running {
		if c, ok := t.created[name]; ok {
			out = append(out, max(0, r.Sub(c)))
		}
	}
	return out
}

// lastRunning is when the last VM was first seen Running.
func (t *tracker) lastRunning() time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	var last time.Time
	for _, r := range t.running {
		if r.After(last) {
			last = r
		}
	}
	return last
}

// progressEvery is how often a run in progress says how far it is.
const progressEvery = 2 * time.Second

// report says every interval how many VMs are created and Running, the
// rate since start and over the last interval, until the run is done or ctx
// ends: a burst of 1000 takes minutes.
func (t *tracker) report(ctx context.Context, start time.Time, every time.Duration, progress func(string, ...any)) {
	tick := time.NewTicker(every)
	defer tick.Stop()
	last := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.done:
			return
		case <-tick.C:
		}
		created, running := t.counts()
		elapsed := time.Since(start).Seconds()
		progress("%d of %d created, %d Running; %.1f VMs/s overall, %.1f VMs/s now",
			created, t.want, running, float64(running)/elapsed, float64(running-last)/every.Seconds())
		last = running
	}
}

func (t *tracker) counts() (created, running int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.created), len(t.running)
}

// watchRunning feeds t from a watch on the benchmark namespace's
// VirtualMachines until ctx ends. It resumes from the last resource version
// when the API server closes the watch, so a long burst loses no event.
func watchRunning(ctx context.Context, kube client.WithWatch, t *tracker) error {
	l := &v1alpha1.VirtualMachineList{}
	if err := kube.List(ctx, l, client.InNamespace(namespace)); err != nil {
		return errors.Wrap(err, "cannot list VirtualMachines")
	}
	w, err := watchtools.NewRetryWatcherWithContext(ctx, l.ResourceVersion, watcherFunc(func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
		return kube.Watch(ctx, &v1alpha1.VirtualMachineList{}, client.InNamespace(namespace), &client.ListOptions{Raw: &o})
	}))
	if err != nil {
		return errors.Wrap(err, "cannot watch VirtualMachines")
	}
	go func() {
		defer w.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case e, ok := <-w.ResultChan():
				if !ok {
					return
				}
				vm, isVM := e.Object.(*v1alpha1.VirtualMachine)
				if !isVM || (e.Type != watch.Added && e.Type != watch.Modified) {
					continue
				}
				now := time.Now()
				if vm.GetAnnotations()[v1alpha1.AnnotationNode] != "" {
					t.markScheduled(vm.Name, now)
				}
				if vm.Status.AtProvider.Phase == v1alpha1.PhaseRunning {
					t.markRunning(vm.Name, now)
				}
			}
		}
	}()
	return nil
}

type watcherFunc func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error)

func (f watcherFunc) WatchWithContext(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
	return f(ctx, o)
}

// spread is how many of the benchmark's VMs each node runs, from their
// status, to show how evenly placement spread them; how many show an
// address on every interface; and how many addresses more than one VM
// shows on the same network (each VM beyond the first counts once).
func spread(ctx context.Context, kube client.Client) (perNode map[string]int, addressed, duplicates int, err error) {
	l := &v1alpha1.VirtualMachineList{}
	if err := kube.List(ctx, l, client.InNamespace(namespace)); err != nil {
		return nil, 0, 0, errors.Wrap(err, "cannot list VirtualMachines")
	}
	perNode = map[string]int{}
	shown := map[string]int{}
	for i := range l.Items {
		vm := &l.Items[i]
		if strings.HasPrefix(vm.Name, warmUpName) {
			continue
		}
		perNode[vm.Status.AtProvider.Node]++
		all := len(vm.Status.AtProvider.Interfaces) > 0
		for _, ifc := range vm.Status.AtProvider.Interfaces {
			all = all && len(ifc.IPs) > 0
			for _, ip := range ifc.IPs {
				shown[ifc.Network+"/"+ip]++
			}
		}
		if all {
			addressed++
		}
	}
	for _, n := range shown {
		duplicates += n - 1
	}
	return perNode, addressed, duplicates, nil
}
