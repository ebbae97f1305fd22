package kubevirt

import (
	"context"
	"math"
	"net/http"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	toolscache "k8s.io/client-go/tools/cache"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/agent/driver"
)

// syncTimeout bounds the wait for fresh informers, at start and after an
// outage.
const syncTimeout = 30 * time.Second

// connection is one set of informers and the client reading from them.
type connection struct {
	client client.Client
	cancel context.CancelFunc
	done   chan struct{}
}

// connect starts informers on virtfleet's VMs and all VMIs in the namespace
// and on the Nodes, and waits until they have listed everything.
func (d *Driver) connect(ctx context.Context) (*connection, error) {
	managed, err := labels.NewRequirement(LabelUID, selection.Exists, nil)
	if err != nil {
		return nil, errors.Wrap(err, "cannot build the label selector")
	}
	selector := labels.NewSelector().Add(*managed)
	c, err := cache.New(d.config, cache.Options{
		Scheme: d.scheme,
		ByObject: map[client.Object]cache.ByObject{
			&kubevirtv1.VirtualMachine{}:         {Namespaces: map[string]cache.Config{d.namespace: {}}, Label: selector},
			&kubevirtv1.VirtualMachineInstance{}: {Namespaces: map[string]cache.Config{d.namespace: {}}},
		},
		DefaultWatchErrorHandler:    func(context.Context, *toolscache.Reflector, error) { d.suspectOutage() },
		ReaderFailOnMissingInformer: true,
	})
	if err != nil {
		return nil, errors.Wrap(err, "cannot create informers for the KubeVirt cluster")
	}
	for _, obj := range []client.Object{&kubevirtv1.VirtualMachine{}, &kubevirtv1.VirtualMachineInstance{}, &corev1.Node{}} {
		inf, err := c.GetInformer(ctx, obj)
		if err != nil {
			return nil, errors.Wrap(err, "cannot create an informer")
		}
		if _, err := inf.AddEventHandler(d.handler(obj, c)); err != nil {
			return nil, errors.Wrap(err, "cannot watch the KubeVirt cluster")
		}
	}
	cctx, cancel := context.WithCancel(d.ctx)
	conn := &connection{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(conn.done)
		_ = c.Start(cctx)
	}()
	sctx, stop := context.WithTimeout(ctx, syncTimeout)
	defer stop()
	if !c.WaitForCacheSync(sctx) {
		cancel()
		<-conn.done
		return nil, errors.Errorf("cannot list VirtualMachines, VirtualMachineInstances and Nodes of the KubeVirt cluster at %s within %s", d.config.Host, syncTimeout)
	}
	conn.client, err = client.New(d.config, client.Options{Scheme: d.scheme, Cache: &client.CacheOptions{Reader: c}})
	if err != nil {
		cancel()
		<-conn.done
		return nil, errors.Wrap(err, "cannot create a client for the KubeVirt cluster")
	}
	return conn, nil
}

// handler turns informer notifications into hints. Node changes concern no
// guest; capacity is read on every heartbeat anyway. A VMI's hint names the
// uid on its VM, read from vms (an adopted or imported guest's VMI carries
// the uid it was made for, or none), or the VMI's own once the VM is gone.
func (d *Driver) handler(obj client.Object, vms client.Reader) toolscache.ResourceEventHandler {
	if _, ok := obj.(*corev1.Node); ok {
		return toolscache.ResourceEventHandlerFuncs{}
	}
	_, isVM := obj.(*kubevirtv1.VirtualMachine)
	hint := func(o any, kind driver.EventKind) {
		if tomb, ok := o.(toolscache.DeletedFinalStateUnknown); ok {
			o = tomb.Obj
		}
		m, ok := o.(metav1.Object)
		if !ok {
			return
		}
		uid := m.GetLabels()[LabelUID]
		vm := &kubevirtv1.VirtualMachine{}
		if !isVM && vms.Get(d.ctx, types.NamespacedName{Namespace: m.GetNamespace(), Name: m.GetName()}, vm) == nil {
			uid = vm.Labels[LabelUID]
		}
		if uid != "" {
			d.emit(driver.Event{UID: uid, Kind: kind})
		}
	}
	return toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(o any) {
			if isVM {
				hint(o, driver.EventDefined)
			} else {
				hint(o, driver.EventChanged)
			}
		},
		UpdateFunc: func(old, o any) {
			was, _ := old.(*kubevirtv1.VirtualMachineInstance)
			is, _ := o.(*kubevirtv1.VirtualMachineInstance)
			switch {
			case was != nil && is != nil && was.Status.Phase != kubevirtv1.Running && is.Status.Phase == kubevirtv1.Running:
				hint(o, driver.EventStarted)
			case was != nil && is != nil && is.Status.Phase == kubevirtv1.Failed:
				hint(o, driver.EventCrashed)
			default:
				hint(o, driver.EventChanged)
			}
		},
		DeleteFunc: func(o any) {
			if isVM {
				hint(o, driver.EventUndefined)
			} else {
				hint(o, driver.EventStopped)
			}
		},
	}
}

// emit never blocks an informer: a lagging receiver loses hints, which the
// contract allows, and resyncs.
func (d *Driver) emit(e driver.Event) {
	d.eventsMu.RLock()
	defer d.eventsMu.RUnlock()
	if d.closed {
		return
	}
	select {
	case d.events <- e:
	default:
	}
}

// suspectOutage asks watchHealth to check the API server now rather than
// at its next probe.
func (d *Driver) suspectOutage() {
	select {
	case d.suspect <- struct{}{}:
	default:
	}
}

// probeInterval is how often the API server's readiness is checked. The
// informers alone do not tell: while the API server is down they keep
// serving what they last saw and retry their watches quietly.
const probeInterval = time.Second

// watchHealth probes the API server, and when it does not answer marks the
// driver down until it does, then replaces the informers (the old ones may
// wait out a long back-off) and asks for a resync.
func (d *Driver) watchHealth() {
	defer close(d.done)
	tick := time.NewTicker(probeInterval)
	defer tick.Stop()
	for {
		select {
		case <-d.ctx.Done():
			return
		case <-d.suspect:
		case <-tick.C:
		}
		err := d.ready()
		if err == nil {
			continue
		}
		d.mu.Lock()
		d.down = errors.Wrapf(err, "the KubeVirt API server at %s does not answer", d.config.Host)
		d.mu.Unlock()
		conn := d.reconnect()
		if conn == nil {
			return // closed
		}
		d.mu.Lock()
		old := d.conn
		d.conn, d.down = conn, nil
		d.mu.Unlock()
		old.cancel()
		<-old.done
		d.emit(driver.Event{Kind: driver.EventResync})
	}
}

// reconnect waits until the API server answers and fresh informers have
// synced; nil means the driver was closed.
func (d *Driver) reconnect() *connection {
	backoff := wait.Backoff{Duration: 100 * time.Millisecond, Factor: 2, Cap: 2 * time.Second, Steps: math.MaxInt32}
	for {
		select {
		case <-d.ctx.Done():
			return nil
		case <-time.After(backoff.Step()):
		}
		if d.ready() != nil {
			continue
		}
		if conn, err := d.connect(d.ctx); err == nil {
			return conn
		}
	}
}

// ready asks the API server's /readyz, which every client may read.
func (d *Driver) ready() error {
	ctx, cancel := context.WithTimeout(d.ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, d.config.Host+"/readyz", nil)
	if err != nil {
		return errors.Wrap(err, "cannot build the readiness request")
	}
	resp, err := d.probe.Do(req)
	if err != nil {
		return err
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return errors.Errorf("readyz answered %s", resp.Status)
	}
	return nil
}

// client is the current connection's client, or why there is none.
func (d *Driver) client() (client.Client, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.ctx.Err() != nil {
		return nil, errors.New("driver is closed")
	}
	if d.down != nil {
		return nil, d.down
	}
	return d.conn.client, nil
}
