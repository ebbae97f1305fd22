// Package kubevirt is the driver.Driver that fronts one namespace of a
// Kubernetes cluster running KubeVirt: each guest is a KubeVirt
// VirtualMachine labelled LabelUID with the uid of the VM managing it, and
// KubeVirt runs it. A guest the driver makes is named VMName(uid); one it
// adopted or imported keeps its own name (see Claim). The driver talks to
// that *target* cluster with the kubeconfig the operator gives the agent —
// never to the hub's cluster.
//
// Reads come from informers (a controller-runtime cache) on the
// VirtualMachines labelled LabelUID in the namespace, on every
// VirtualMachineInstance of the namespace (an imported guest's carry no
// label of virtfleet's) and on the Nodes; their changes are the driver's
// Events. Writes go to the API server as merge patches of what changed, so
// fields of a newer KubeVirt than the driver knows are never dropped. When
// the API server goes away every call fails with a retryable error until it
// is back; then the driver starts fresh informers and sends EventResync.
//
// Mapping (see newVM): vcpu → cores, memory → guest memory and its request,
// each disk → a PVC named ObjectName(disk) (made with the disk's size when
// missing, never deleted; a disk from an image → a DataVolume of that
// name, below), each network → a Multus network of the same
// ObjectName (the NetworkAttachmentDefinition is the site's to provide; the
// first network is the default one), public key, swap and user data →
// cloudInitNoCloud, the hub's addresses → a fixed MAC per interface and
// static cloud-init network data (the site's IPAM does not know them),
// running → runStrategy Always or Halted. A restart deletes the VMI, which
// KubeVirt recreates (the restart subresource is served by virt-api, an
// aggregated API server); so does a reset, with no grace period, since
// kubevirt.io/api has no reset of a VMI in place. A pause is the VMI's pause
// subresource of that same API (subresources.kubevirt.io/v1, through the
// API server, as virtctl pause does), which KubeVirt shows as the VMI's
// condition Paused; the guest's serial console and display are the VMI's
// console and vnc WebSocket subresources of it (see OpenConsole). What the
// agent's account must be allowed is listed on Config. MigrateHost moves a
// running guest to another node of the cluster with a
// VirtualMachineInstanceMigration (see migrate.go).
//
// Disks from images (see datavolume.go) need CDI, the
// containerized-data-importer, in the cluster: a missing disk with an Image
// becomes a CDI DataVolume of the disk's ObjectName (cdi.kubevirt.io/v1beta1,
// an http source with the image's URL, storage of the disk's size, labelled
// managed-by virtfleet and LabelImageUID), which CDI fills into the PVC of
// that name it makes and owns; the guest's volume for it is that
// dataVolume. These DataVolumes are the only CDI objects the driver writes.
// An existing PVC or DataVolume of the disk's name is never rewritten; the
// node's source policy is checked (checkImageSource) only before a
// DataVolume is made. The VM is created at once, as KubeVirt expects: it
// makes the VMI and holds it Pending (printableStatus Provisioning) until
// CDI has filled the PVC. While a disk of the guest is imported, Ensure
// reports Provisioning with CDI's progress ("importing image <name>:
// 45.00%"), and an IsFailing error with CDI's message while the import
// fails (CDI retries by restarting its importer). CDI has no checksum for
// an http source, so the agent downloads an image with a SHA256 and
// verifies it before it makes the DataVolume (checkImageSource); an image
// made from a volume is refused as terminal. The driver
// keeps no images of its own: each disk is one import, and the driver is
// no driver.ImageKeeper. DeleteVolume deletes the DataVolume and its PVC.
package kubevirt

import (
	"cmp"
	"context"
	"encoding/json"
	"math"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	kubevirtv1 "kubevirt.io/api/core/v1"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/agent/driver/imageimport"
)

// DefaultNamespace is used when Config names none.
const DefaultNamespace = "default"

// syncTimeout bounds the wait for fresh informers, at start and after an
// outage.
const syncTimeout = 30 * time.Second

// Driver is the kubevirt driver.Driver.
type Driver struct {
	namespace string
	// accessMode is the access mode of the PVCs the driver makes.
	accessMode corev1.PersistentVolumeAccessMode
	config     *rest.Config
	scheme     *runtime.Scheme
	// live reads the API server directly, for the few reads that must not
	// be stale (a Delete's completion).
	live client.Client
	// probe asks the API server whether it is ready.
	probe *http.Client
	// subresources reaches KubeVirt's subresource API through the API
	// server.
	subresources rest.Interface
	now          func() time.Time

	ctx       context.Context
	cancel    context.CancelFunc
	closeOnce sync.Once
	events    chan driver.Event
	// eventsMu guards closing events against informers still sending.
	eventsMu sync.RWMutex
	closed   bool
	suspect  chan struct{}
	done     chan struct{}

	// claimMu serialises claims, so two VMs never take one guest.
	claimMu sync.Mutex

	// migrations are the live migrations the driver saw, by guest and id.
	migrations migrationLog

	// verify checks images with a SHA256 before CDI imports them
	// (checkImageSource); verified are the images it vouched for, by uid.
	verify     *imageimport.Imports
	verifiedMu sync.Mutex
	verified   map[string]string

	mu sync.Mutex
	// conn reads from the current informers and writes to the API server.
	conn *connection
	// down is why the API server is unreachable; nil while it answers.
	down error
}

// connection is one set of informers and the client reading from them.
type connection struct {
	client client.Client
	cancel context.CancelFunc
	done   chan struct{}
}

var _ driver.Driver = (*Driver)(nil)

// New connects to the target cluster as cfg says. It fails when the
// kubeconfig is unusable or the API server does not answer in time, so
// misconfiguration shows at start-up; later outages are waited out.
func New(ctx context.Context, cfg Config) (driver.Driver, error) {
	return Open(ctx, cfg)
}

// Open is New returning the concrete type.
func Open(ctx context.Context, cfg Config) (*Driver, error) {
	rc, err := restConfig(cfg.Kubeconfig)
	if err != nil {
		return nil, err
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, errors.Wrap(err, "cannot register Kubernetes types")
	}
	if err := kubevirtv1.AddToScheme(scheme); err != nil {
		return nil, errors.Wrap(err, "cannot register KubeVirt types")
	}
	if err := cdiv1.AddToScheme(scheme); err != nil {
		return nil, errors.Wrap(err, "cannot register CDI types")
	}
	live, err := client.New(rc, client.Options{Scheme: scheme})
	if err != nil {
		return nil, errors.Wrap(err, "cannot create a client for the KubeVirt cluster")
	}
	httpClient, err := rest.HTTPClientFor(rc)
	if err != nil {
		return nil, errors.Wrap(err, "cannot create an HTTP client for the KubeVirt cluster")
	}
	httpClient.Timeout = 2 * time.Second
	sub := rest.CopyConfig(rc)
	sub.GroupVersion = &schema.GroupVersion{Group: kubevirtv1.SubresourceGroupName, Version: kubevirtv1.ApiLatestVersion}
	sub.APIPath = "/apis"
	sub.NegotiatedSerializer = serializer.NewCodecFactory(scheme).WithoutConversion()
	subresources, err := rest.RESTClientFor(sub)
	if err != nil {
		return nil, errors.Wrap(err, "cannot create a client for KubeVirt's subresource API")
	}
	d := &Driver{
		namespace:    cmp.Or(cfg.Namespace, DefaultNamespace),
		accessMode:   cmp.Or(cfg.AccessMode, corev1.ReadWriteOnce),
		config:       rc,
		scheme:       scheme,
		live:         live,
		probe:        httpClient,
		subresources: subresources,
		now:          time.Now,
		events:       make(chan driver.Event, 256),
		suspect:      make(chan struct{}, 1),
		done:         make(chan struct{}),
		verify:       imageimport.New(cfg.Images),
		verified:     map[string]string{},
	}
	d.ctx, d.cancel = context.WithCancel(context.WithoutCancel(ctx))
	if d.conn, err = d.connect(ctx); err != nil {
		d.cancel()
		return nil, err
	}
	go d.watchHealth()
	return d, nil
}

// restConfig reads the kubeconfig, or the in-cluster configuration when
// there is none. Errors name the file, never its contents.
func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig == "" {
		rc, err := rest.InClusterConfig()
		return rc, errors.Wrap(err, "--kubevirt-kubeconfig is empty and there is no in-cluster configuration")
	}
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, errors.Errorf("--kubevirt-kubeconfig %s: cannot load it", kubeconfig)
	}
	rc.UserAgent = "virtfleet-agent"
	return rc, nil
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

// Events implements driver.Driver.
func (d *Driver) Events() <-chan driver.Event { return d.events }

// Close implements driver.Driver.
func (d *Driver) Close() error {
	d.closeOnce.Do(d.close)
	return nil
}

func (d *Driver) close() {
	d.cancel()
	<-d.done
	d.verify.Wait()
	d.mu.Lock()
	conn := d.conn
	d.mu.Unlock()
	conn.cancel()
	<-conn.done
	d.eventsMu.Lock()
	d.closed = true
	close(d.events)
	d.eventsMu.Unlock()
}

func (d *Driver) key(uid string) types.NamespacedName {
	return types.NamespacedName{Namespace: d.namespace, Name: VMName(uid)}
}

// get reads the VM uid manages and its VMI (nil when there is none). A VM
// missing from the informers is looked for on the API server too: one just
// created or claimed may not have arrived yet. A VM named VMName(uid) that
// is no guest of virtfleet's is refused as terminal; one that uid released
// or that another VM manages now is a NotFound *NotOursError.
func (d *Driver) get(ctx context.Context, c client.Reader, uid string) (*kubevirtv1.VirtualMachine, *kubevirtv1.VirtualMachineInstance, error) {
	vm, err := d.lookup(ctx, c, uid)
	if driver.IsNotFound(err) {
		vm, err = d.lookup(ctx, d.live, uid)
	}
	if err != nil {
		return nil, nil, err
	}
	vmi, err := d.instance(ctx, c, vm)
	return vm, vmi, err
}

// lookup finds the VM uid manages through r: the one labelled with uid and
// not released, else the one named VMName(uid) to say why there is none.
func (d *Driver) lookup(ctx context.Context, r client.Reader, uid string) (*kubevirtv1.VirtualMachine, error) {
	vms := &kubevirtv1.VirtualMachineList{}
	if err := r.List(ctx, vms, client.InNamespace(d.namespace), client.MatchingLabels{LabelUID: uid}); err != nil {
		return nil, errors.Wrap(err, "cannot list KubeVirt VirtualMachines")
	}
	for i := range vms.Items {
		if !orphaned(&vms.Items[i]) {
			return &vms.Items[i], nil
		}
	}
	vm := &kubevirtv1.VirtualMachine{}
	err := r.Get(ctx, d.key(uid), vm)
	switch owner := vm.Labels[LabelUID]; {
	case kerrors.IsNotFound(err):
		return nil, driver.NotFoundf("no KubeVirt VirtualMachine of uid %s in namespace %s", uid, d.namespace)
	case err != nil:
		return nil, errors.Wrap(err, "cannot get the KubeVirt VirtualMachine")
	case owner == "":
		return nil, driver.Terminalf("KubeVirt VirtualMachine %s/%s exists but is not managed by virtfleet", d.namespace, vm.Name)
	case owner == uid:
		return nil, driver.NotFound(&NotOursError{UID: uid, VM: vm.Name, Why: "was released and is orphaned"})
	default:
		return nil, driver.NotFound(&NotOursError{UID: uid, VM: vm.Name, Why: "is managed by VirtualMachine " + vm.Annotations[AnnotationNamespace] + "/" + vm.Annotations[AnnotationName] + " now"})
	}
}

// instance reads vm's VMI through r: the VMI of its name that it controls,
// or nil.
func (d *Driver) instance(ctx context.Context, r client.Reader, vm *kubevirtv1.VirtualMachine) (*kubevirtv1.VirtualMachineInstance, error) {
	vmi := &kubevirtv1.VirtualMachineInstance{}
	switch err := r.Get(ctx, types.NamespacedName{Namespace: vm.Namespace, Name: vm.Name}, vmi); {
	case kerrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, errors.Wrap(err, "cannot get the KubeVirt VirtualMachineInstance")
	case !metav1.IsControlledBy(vmi, vm):
		return nil, nil
	}
	return vmi, nil
}

// retry runs op reading through c, and again reading from the API server
// after a conflict — KubeVirt writes the VM's status often and the
// informers may lag — at most three times in all.
func (d *Driver) retry(c client.Reader, op func(r client.Reader) error) error {
	r := c
	for attempt := 1; ; attempt++ {
		err := op(r)
		if !kerrors.IsConflict(err) || attempt == 3 {
			return err
		}
		r = d.live
	}
}

// patch writes next, a changed copy of vm, as a JSON merge patch of the
// difference, guarded by vm's resourceVersion: fields the driver's KubeVirt
// types do not know are left as they are on the API server.
func patch(ctx context.Context, c client.Client, vm, next *kubevirtv1.VirtualMachine) error {
	return c.Patch(ctx, next, client.MergeFromWithOptions(vm, client.MergeFromWithOptimisticLock{}))
}

// Ensure implements driver.Driver.
func (d *Driver) Ensure(ctx context.Context, m driver.Machine) (driver.Observation, error) {
	if err := validate(m); err != nil {
		return driver.Observation{}, err
	}
	want, err := newVM(m, d.namespace)
	if err != nil {
		return driver.Observation{}, err
	}
	c, err := d.client()
	if err != nil {
		return driver.Observation{}, err
	}
	var o driver.Observation
	err = d.retry(c, func(r client.Reader) (err error) {
		o, err = d.ensure(ctx, c, r, m, want)
		return err
	})
	if err != nil {
		return o, err
	}
	return d.imports(ctx, m, o)
}

// ensure is one read-modify-write of Ensure: reads through reader, writes
// through c. An imported guest's definition is its own: only its power
// state and restarts are driven.
func (d *Driver) ensure(ctx context.Context, c client.Client, reader client.Reader, m driver.Machine, want *kubevirtv1.VirtualMachine) (driver.Observation, error) {
	vm, vmi, err := d.get(ctx, reader, m.UID)
	var notOurs *NotOursError
	switch {
	case errors.As(err, &notOurs):
		return driver.Observation{}, driver.Terminal(err)
	case driver.IsNotFound(err):
		return d.create(ctx, c, m, want.DeepCopy())
	case err != nil:
		return driver.Observation{}, err
	}

	next := vm.DeepCopy()
	if !imported(vm) && shape(vm.Spec.Template) != shape(want.Spec.Template) {
		// Takes effect when KubeVirt next creates the VMI; a new disk's
		// image still being checked holds the new shape back until then.
		progress, err := d.ensureVolumes(ctx, c, m)
		if err != nil {
			return driver.Observation{}, err
		}
		if progress == "" {
			next.Spec.Template = want.Spec.Template
		}
	}
	wasRunning := wantsRunning(vm, vmi)
	if wasRunning != m.Running {
		next.Spec.RunStrategy, next.Spec.Running = want.Spec.RunStrategy, nil //nolint:staticcheck // KubeVirt takes one of the two
	}
	if !m.Running && runs(vmi) && pausedVMI(vmi) {
		// Resumed, the guest shuts down cleanly when KubeVirt stops it;
		// paused, it would be killed once its grace period is over.
		if err := d.subresource(ctx, vmi, "unpause", &kubevirtv1.UnpauseOptions{}); err != nil {
			return driver.Observation{}, err
		}
	}
	next.Annotations = merged(next.Annotations, want.Annotations)
	count, seen := restarts(vm, vmi)
	restart, hard := d.restartTarget(next, vmi, m, wasRunning)
	switch {
	case !m.Running:
		// A stopped guest has no VMI to count recreations from, and a
		// restart asked for meanwhile is satisfied by the next start.
		next.Annotations[AnnotationVMI] = ""
		next.Annotations[AnnotationRestartNonce] = m.RestartNonce
	case restart != nil && restart.UID != types.UID(next.Annotations[AnnotationRestartVMI]):
		count++
		next.Annotations[AnnotationRestartVMI] = string(restart.UID)
		fallthrough
	default:
		next.Annotations[AnnotationVMI] = seen
		next.Annotations[AnnotationRestartNonce] = m.RestartNonce
	}
	if _, recorded := next.Annotations[AnnotationResetNonce]; recorded || m.ResetNonce != "" {
		// Handled by the restart just recorded, or by the next start; an
		// empty one asks for none, so the same nonce asks again.
		next.Annotations[AnnotationResetNonce] = m.ResetNonce
	}
	next.Annotations[AnnotationRestarts] = strconv.Itoa(int(count))
	if !equalVM(vm, next) {
		if err := patch(ctx, c, vm, next); err != nil {
			return driver.Observation{}, errors.Wrap(err, "cannot update the KubeVirt VirtualMachine")
		}
	}
	if restart != nil {
		// Only that VMI: never a replacement KubeVirt made meanwhile. A
		// reset gives the guest no time to shut down.
		opts := []client.DeleteOption{client.Preconditions{UID: &restart.UID}}
		if hard {
			opts = append(opts, client.GracePeriodSeconds(0))
		}
		err := c.Delete(ctx, restart, opts...)
		if err != nil && !kerrors.IsNotFound(err) && !kerrors.IsConflict(err) {
			return driver.Observation{}, errors.Wrap(err, "cannot delete the VMI to restart the guest")
		}
		vmi = nil
	}
	o := observe(next, vmi, d.now())
	if !m.Running || !wasRunning || !runs(vmi) {
		// A VMI that is not running yet (a new one after a start or a
		// restart) is paused by a later call, once it runs.
		return o, nil
	}
	switch {
	case m.Paused && !pausedVMI(vmi):
		if err := d.subresource(ctx, vmi, "pause", &kubevirtv1.PauseOptions{}); err != nil {
			return driver.Observation{}, err
		}
		// virt-api answers once virt-handler paused the guest; the
		// condition that says so comes with a later VMI update.
		if o.Phase == driver.PhaseRunning {
			o.Phase = driver.PhasePaused
		}
	case !m.Paused && pausedVMI(vmi):
		if err := d.subresource(ctx, vmi, "unpause", &kubevirtv1.UnpauseOptions{}); err != nil {
			return driver.Observation{}, err
		}
		if o.Phase == driver.PhasePaused {
			o.Phase = driver.PhaseRunning
		}
	}
	return o, nil
}

// runs is whether vmi is a VMI KubeVirt runs and keeps running: one that
// can be paused and unpaused.
func runs(vmi *kubevirtv1.VirtualMachineInstance) bool {
	return vmi != nil && vmi.DeletionTimestamp == nil && vmi.Status.Phase == kubevirtv1.Running
}

// subresource asks KubeVirt's subresource API (served by virt-api through
// the API server) for the VMI's subresource sub, pause or unpause, with
// opts, as virtctl does. virt-api refuses with a conflict what the VMI's
// state does not allow (not running, already paused, not paused): the
// informers were behind, and the caller comes back.
func (d *Driver) subresource(ctx context.Context, vmi *kubevirtv1.VirtualMachineInstance, sub string, opts any) error {
	body, err := json.Marshal(opts)
	if err != nil {
		return errors.Wrapf(err, "cannot encode the options of %s", sub)
	}
	err = d.subresources.Put().Namespace(vmi.Namespace).Resource("virtualmachineinstances").Name(vmi.Name).SubResource(sub).Body(body).Do(ctx).Error()
	if kerrors.IsNotFound(err) && kerrors.HasStatusCause(err, metav1.CauseTypeUnexpectedServerResponse) {
		// Not virt-api's answer, a Status naming the VMI, but the API
		// server's plain 404 for a path it serves no API at.
		return errors.Wrapf(err, "cannot %s VMI %s/%s: the cluster serves no %s/%s API (KubeVirt's virt-api serves it)", sub, vmi.Namespace, vmi.Name, kubevirtv1.SubresourceGroupName, kubevirtv1.ApiLatestVersion)
	}
	return errors.Wrapf(err, "cannot %s VMI %s/%s", sub, vmi.Namespace, vmi.Name)
}

// restartTarget is the VMI to delete to restart the guest, if any: on a new
// restart or reset nonce for a guest that was already running (the nonces
// it starts with count as handled), or to finish a restart the annotations
// record but whose delete was lost. hard is set for a reset alone.
func (d *Driver) restartTarget(vm *kubevirtv1.VirtualMachine, vmi *kubevirtv1.VirtualMachineInstance, m driver.Machine, wasRunning bool) (target *kubevirtv1.VirtualMachineInstance, hard bool) {
	if vmi == nil || vmi.DeletionTimestamp != nil || !m.Running || !wasRunning {
		return nil, false
	}
	a := vm.Annotations
	if string(vmi.UID) == a[AnnotationRestartVMI] {
		return vmi, false
	}
	if m.RestartNonce != "" && m.RestartNonce != a[AnnotationRestartNonce] {
		return vmi, false
	}
	if m.ResetNonce != "" && m.ResetNonce != a[AnnotationResetNonce] {
		return vmi, true
	}
	return nil, false
}

// create makes the guest's PVCs and DataVolumes and its VM. A VM that
// exists already (another Ensure won the race) is read and ensured on the
// next call.
func (d *Driver) create(ctx context.Context, c client.Client, m driver.Machine, vm *kubevirtv1.VirtualMachine) (driver.Observation, error) {
	if progress, err := d.ensureVolumes(ctx, c, m); err != nil || progress != "" {
		return driver.Observation{UID: m.UID, Phase: driver.PhaseProvisioning, Message: progress}, err
	}
	vm.Annotations[AnnotationRestartNonce] = m.RestartNonce
	if m.ResetNonce != "" {
		vm.Annotations[AnnotationResetNonce] = m.ResetNonce
	}
	vm.Annotations[AnnotationRestarts] = "0"
	if err := c.Create(ctx, vm); err != nil {
		if kerrors.IsAlreadyExists(err) {
			return driver.Observation{}, errors.New("the KubeVirt VirtualMachine was created concurrently; ensuring it again")
		}
		if kerrors.IsInvalid(err) || kerrors.IsBadRequest(err) {
			return driver.Observation{}, driver.Terminal(errors.Wrap(err, "KubeVirt rejected the VirtualMachine"))
		}
		return driver.Observation{}, errors.Wrap(err, "cannot create the KubeVirt VirtualMachine")
	}
	return observe(vm, nil, d.now()), nil
}

// ensureVolumes creates the guest's disks that are missing: a DataVolume
// for one from an image (ensureDataVolume), else an empty PVC of the
// disk's size; existing ones are left as they are. It returns the
// progress of the source checks that hold a DataVolume back.
func (d *Driver) ensureVolumes(ctx context.Context, c client.Client, m driver.Machine) (string, error) {
	var waiting []string
	for _, disk := range m.Disks {
		if disk.Image != nil {
			progress, err := d.ensureDataVolume(ctx, c, disk)
			if err != nil {
				return "", err
			}
			if progress != "" {
				waiting = append(waiting, progress)
			}
			continue
		}
		if disk.SizeBytes <= 0 {
			continue // must exist already: nothing to make it with
		}
		pvc := &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Namespace: d.namespace, Name: ObjectName(disk.Name), Labels: map[string]string{labelManagedBy: managedBy}},
			Spec: corev1.PersistentVolumeClaimSpec{
				AccessModes: []corev1.PersistentVolumeAccessMode{d.accessMode},
				Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: *resource.NewQuantity(disk.SizeBytes, resource.BinarySI)}},
			},
		}
		if disk.Pool != "" {
			pvc.Spec.StorageClassName = ptr(disk.Pool)
		}
		err := c.Create(ctx, pvc)
		switch {
		case err == nil, kerrors.IsAlreadyExists(err):
		case kerrors.IsInvalid(err):
			return "", driver.Terminal(errors.Wrapf(err, "the KubeVirt cluster rejected PVC %s", pvc.Name))
		default:
			return "", errors.Wrapf(err, "cannot create PVC %s", pvc.Name)
		}
	}
	return strings.Join(waiting, "; "), nil
}

// The label on the PVCs and DataVolumes the driver creates (and so on the
// PVCs CDI makes for those DataVolumes); it deletes only those.
const (
	labelManagedBy = "app.kubernetes.io/managed-by"
	managedBy      = "virtfleet"
)

func merged(into, from map[string]string) map[string]string {
	if into == nil {
		into = map[string]string{}
	}
	for k, v := range from {
		into[k] = v
	}
	return into
}

func equalVM(a, b *kubevirtv1.VirtualMachine) bool {
	return reflect.DeepEqual(a.Spec.RunStrategy, b.Spec.RunStrategy) && reflect.DeepEqual(a.Spec.Running, b.Spec.Running) && //nolint:staticcheck // an imported VM may use it
		maps(a.Annotations, b.Annotations) && shape(a.Spec.Template) == shape(b.Spec.Template)
}

// shape is the shape hash a template was made with; empty for none.
func shape(t *kubevirtv1.VirtualMachineInstanceTemplateSpec) string {
	if t == nil {
		return ""
	}
	return t.ObjectMeta.Annotations[AnnotationShape]
}

func maps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if bv, ok := b[k]; !ok || bv != v {
			return false
		}
	}
	return true
}

// Delete implements driver.Driver. The VM is deleted and KubeVirt stops its
// VMI; Delete reports success only once the VM is gone, so the caller keeps
// calling while KubeVirt's finalizer holds it. PVCs stay. A guest uid
// released, or that another VM manages now, is left alone.
func (d *Driver) Delete(ctx context.Context, uid string) error {
	c, err := d.client()
	if err != nil {
		return err
	}
	// Read from the API server, not the informers, and delete only the
	// version read: a VM released a moment ago may still look managed in
	// the informers, and deleting it would destroy the orphan.
	vm, err := d.lookup(ctx, d.live, uid)
	switch {
	case driver.IsNotFound(err): // also a *NotOursError
		return nil
	case err != nil:
		return err
	}
	if vm.DeletionTimestamp == nil {
		err := c.Delete(ctx, vm, client.Preconditions{UID: &vm.UID, ResourceVersion: &vm.ResourceVersion})
		switch {
		case kerrors.IsNotFound(err):
			return nil
		case kerrors.IsConflict(err):
			return errors.Wrap(err, "the KubeVirt VirtualMachine changed while being deleted")
		case err != nil:
			return errors.Wrap(err, "cannot delete the KubeVirt VirtualMachine")
		}
	}
	left := &kubevirtv1.VirtualMachine{}
	err = d.live.Get(ctx, client.ObjectKeyFromObject(vm), left)
	switch {
	case kerrors.IsNotFound(err), err == nil && left.UID != vm.UID:
		return nil
	case err != nil:
		return errors.Wrap(err, "cannot get the KubeVirt VirtualMachine")
	}
	return errors.Errorf("waiting for KubeVirt to remove VirtualMachine %s/%s", d.namespace, vm.Name)
}

// DeleteVolume implements driver.Driver: it deletes the disk's
// DataVolume and PVC once no VirtualMachine of this driver names it, as a
// persistentVolumeClaim or a dataVolume. A PVC or DataVolume virtfleet did
// not create (no managed-by label) is left alone, as the site's own. The
// PVC of a DataVolume is its garbage, which the cluster's garbage
// collector deletes with it; the driver deletes it too, so the disk is
// gone however CDI left it (a DataVolume CDI removed once it had
// succeeded leaves its PVC behind, unowned).
func (d *Driver) DeleteVolume(ctx context.Context, disk driver.Disk) error {
	c, err := d.client()
	if err != nil {
		return err
	}
	name := ObjectName(disk.Name)
	vms := &kubevirtv1.VirtualMachineList{}
	if err := c.List(ctx, vms, client.InNamespace(d.namespace)); err != nil {
		return errors.Wrap(err, "cannot list KubeVirt VirtualMachines")
	}
	for _, vm := range vms.Items {
		if vm.Spec.Template == nil {
			continue
		}
		for _, v := range vm.Spec.Template.Spec.Volumes {
			if v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ClaimName == name {
				return driver.InUsef("PVC %s is used by KubeVirt VirtualMachine %s", name, vm.Name)
			}
			if v.DataVolume != nil && v.DataVolume.Name == name {
				return driver.InUsef("DataVolume %s is used by KubeVirt VirtualMachine %s", name, vm.Name)
			}
		}
	}
	dv := &cdiv1.DataVolume{}
	err = d.live.Get(ctx, types.NamespacedName{Namespace: d.namespace, Name: name}, dv)
	switch {
	case kerrors.IsNotFound(err), meta.IsNoMatchError(err):
		// None; a cluster without CDI has none.
	case err != nil:
		return errors.Wrapf(err, "cannot get DataVolume %s", name)
	case dv.Labels[labelManagedBy] == managedBy:
		err := c.Delete(ctx, dv, client.Preconditions{UID: &dv.UID}, client.PropagationPolicy(metav1.DeletePropagationBackground))
		if err != nil && !kerrors.IsNotFound(err) {
			return errors.Wrapf(err, "cannot delete DataVolume %s", name)
		}
	}
	pvc := &corev1.PersistentVolumeClaim{}
	err = d.live.Get(ctx, types.NamespacedName{Namespace: d.namespace, Name: name}, pvc)
	switch {
	case kerrors.IsNotFound(err):
		return nil
	case err != nil:
		return errors.Wrapf(err, "cannot get PVC %s", name)
	case pvc.Labels[labelManagedBy] != managedBy:
		return nil
	}
	err = c.Delete(ctx, pvc, client.Preconditions{UID: &pvc.UID})
	if err != nil && !kerrors.IsNotFound(err) {
		return errors.Wrapf(err, "cannot delete PVC %s", name)
	}
	return nil
}

// Observe implements driver.Driver.
func (d *Driver) Observe(ctx context.Context, uid string) (driver.Observation, error) {
	c, err := d.client()
	if err != nil {
		return driver.Observation{}, err
	}
	vm, vmi, err := d.get(ctx, c, uid)
	if err != nil {
		return driver.Observation{}, err
	}
	return observe(vm, vmi, d.now()), nil
}

// List implements driver.Driver.
func (d *Driver) List(ctx context.Context) ([]driver.Observation, error) {
	c, err := d.client()
	if err != nil {
		return nil, err
	}
	return d.observeAll(ctx, c, false)
}

// observeAll observes the VMs virtfleet manages (released false) or those
// released (true), each under the uid on its label; an orphan gets
// OrphanOf.
func (d *Driver) observeAll(ctx context.Context, c client.Reader, released bool) ([]driver.Observation, error) {
	all, err := d.guests(ctx, c)
	if err != nil {
		return nil, err
	}
	vms := slices.DeleteFunc(all, func(vm *kubevirtv1.VirtualMachine) bool { return orphaned(vm) != released })
	vmis := &kubevirtv1.VirtualMachineInstanceList{}
	if err := c.List(ctx, vmis, client.InNamespace(d.namespace)); err != nil {
		return nil, errors.Wrap(err, "cannot list KubeVirt VirtualMachineInstances")
	}
	byName := map[string]*kubevirtv1.VirtualMachineInstance{}
	for i := range vmis.Items {
		byName[vmis.Items[i].Name] = &vmis.Items[i]
	}
	out := make([]driver.Observation, 0, len(vms))
	for _, vm := range vms {
		vmi := byName[vm.Name]
		if vmi != nil && !metav1.IsControlledBy(vmi, vm) {
			vmi = nil
		}
		o := observe(vm, vmi, d.now())
		if orphaned(vm) {
			o.OrphanOf = &driver.VMRef{Namespace: vm.Annotations[AnnotationNamespace], Name: vm.Annotations[AnnotationName], Seal: vm.Annotations[AnnotationSeal]}
		}
		out = append(out, o)
	}
	return out, nil
}

// guests are the VMs labelled with a uid: those managed and those
// released.
func (d *Driver) guests(ctx context.Context, c client.Reader) ([]*kubevirtv1.VirtualMachine, error) {
	vms := &kubevirtv1.VirtualMachineList{}
	if err := c.List(ctx, vms, client.InNamespace(d.namespace), client.HasLabels{LabelUID}); err != nil {
		return nil, errors.Wrap(err, "cannot list KubeVirt VirtualMachines")
	}
	out := make([]*kubevirtv1.VirtualMachine, 0, len(vms.Items))
	for i := range vms.Items {
		out = append(out, &vms.Items[i])
	}
	return out, nil
}

// Capacity implements driver.Driver: the allocatable CPUs and memory of the
// Nodes KubeVirt can schedule on (not cordoned, Ready), and what the VMs
// virtfleet made in the namespace ask for, running or not, orphans
// included: a released VM runs on in the cluster as before.
func (d *Driver) Capacity(ctx context.Context) (driver.Capacity, error) {
	c, err := d.client()
	if err != nil {
		return driver.Capacity{}, err
	}
	nodes := &corev1.NodeList{}
	if err := c.List(ctx, nodes); err != nil {
		return driver.Capacity{}, errors.Wrap(err, "cannot list Nodes")
	}
	var cp driver.Capacity
	for _, n := range nodes.Items {
		if !schedulable(n) {
			continue
		}
		cp.VCPU += n.Status.Allocatable.Cpu().Value()
		cp.MemoryBytes += n.Status.Allocatable.Memory().Value()
	}
	vms, err := d.guests(ctx, c)
	if err != nil {
		return driver.Capacity{}, err
	}
	for _, vm := range vms {
		if vm.Spec.Template == nil {
			continue
		}
		vcpu, memory := size(&vm.Spec.Template.Spec)
		cp.AllocatedVCPU += int64(vcpu)
		cp.AllocatedMemoryBytes += memory
	}
	return cp, nil
}

// schedulable reports whether KubeVirt can place guests on n.
func schedulable(n corev1.Node) bool {
	if n.Spec.Unschedulable {
		return false
	}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
