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
// Mapping (see newVM): vcpu → CPU sockets, memory → guest memory, each
// up to a maximum (maxSockets, maxGuest), in the template or, for a
// Machine of an instance type, in a VirtualMachineInstancetype the VM
// names (see instancetype.go); each disk → a PVC named ObjectName(disk) (made with the disk's size when
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
// console and vnc WebSocket subresources of it (see OpenConsole). Data
// disks are hotpluggable volumes, attached to and detached from a running
// guest through the VM's addvolume and removevolume subresources (see
// hotplug.go). What the
// agent's account must be allowed is listed on Config. MigrateHost moves a
// running guest to another node of the cluster with a
// VirtualMachineInstanceMigration (see migrate.go). Snapshots and reverts
// are KubeVirt's VirtualMachineSnapshots and VirtualMachineRestores (see
// snapshot.go).
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
	"net/http"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	kubevirtv1 "kubevirt.io/api/core/v1"
	instancetypev1beta1 "kubevirt.io/api/instancetype/v1beta1"
	snapshotv1 "kubevirt.io/api/snapshot/v1beta1"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/agent/driver/imageimport"
)

// DefaultNamespace is used when Config names none.
const DefaultNamespace = "default"

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

	// grown are the disk sizes growDisks last found in place.
	grown driver.GrownDisks

	// verify checks images with a SHA256 before CDI imports them
	// (checkImageSource); verified are the images it vouched for, by uid,
	// each as imageimport.InputOf: a change of what was verified asks again.
	verify     *imageimport.Imports
	verifiedMu sync.Mutex
	verified   map[string]string

	mu sync.Mutex
	// conn reads from the current informers and writes to the API server.
	conn *connection
	// down is why the API server is unreachable; nil while it answers.
	down error
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
	if err := snapshotv1.AddToScheme(scheme); err != nil {
		return nil, errors.Wrap(err, "cannot register KubeVirt's snapshot types")
	}
	if err := instancetypev1beta1.AddToScheme(scheme); err != nil {
		return nil, errors.Wrap(err, "cannot register KubeVirt's instance types")
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
