package kubevirttest

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"io"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
)

// What CDI writes on the PVC it makes for a DataVolume
// (pkg/controller/common of containerized-data-importer): its own label,
// the DataVolume it was made for, and the state of the importer pod, from
// which its DataVolume controller derives the DataVolume's status.
const (
	// LabelCDIKey and LabelCDIValue are the label CDI puts on each PVC it
	// makes.
	LabelCDIKey, LabelCDIValue = "app", "containerized-data-importer"

	AnnCreatedForDataVolume = "cdi.kubevirt.io/createdForDataVolume"
	AnnContentType          = "cdi.kubevirt.io/storage.contentType"
	AnnSource               = "cdi.kubevirt.io/storage.import.source"
	AnnEndpoint             = "cdi.kubevirt.io/storage.import.endpoint"
	AnnImportPod            = "cdi.kubevirt.io/storage.import.importPodName"
	AnnPodPhase             = "cdi.kubevirt.io/storage.pod.phase"
	AnnPodRestarts          = "cdi.kubevirt.io/storage.pod.restarts"
	AnnRunningCondition     = "cdi.kubevirt.io/storage.condition.running"
	AnnRunningMessage       = AnnRunningCondition + ".message"
	AnnRunningReason        = AnnRunningCondition + ".reason"
)

// The reasons and messages of CDI's Running condition: a running importer
// pod (PodRunningReason), one whose container ended (the kubelet's
// terminated reasons), and what the importer writes as its termination
// message (cmd/cdi-importer).
const (
	ReasonPodRunning       = "Pod is running"
	ReasonError            = "Error"
	ReasonCompleted        = "Completed"
	msgImportComplete      = "Import Complete"
	msgCannotConnectPrefix = "Unable to connect to http data source: "
	msgCannotProcessPrefix = "Unable to process data: "
)

// Import is what FakeCDI downloaded into a DataVolume's PVC.
type Import struct {
	// DataVolume is the uid of the DataVolume it was imported for.
	DataVolume types.UID
	URL        string
	// SHA256 is the hex digest of the bytes downloaded, and Size their
	// number.
	SHA256 string
	Size   int64
}

// FakeCDI plays CDI's DataVolume controller and its importer pods for the
// DataVolumes of a test cluster, in-process, one step per StepInterval.
// For a DataVolume whose source is http it makes the PVC of the same name,
// as CDI does: owned by the DataVolume, labelled LabelCDIKey and with the
// DataVolume's own labels and annotations, its spec from spec.storage
// (spec.pvc as it is) with the access mode and volume mode the stand-in's
// storage profile gives (ReadWriteOnce, Filesystem) where storage names
// none. It binds the PVC at once, as a provisioner would (the PVC's phase
// only: there is no PersistentVolume). Then it runs the importer: a plain
// GET of the URL (no certificates, secrets or extra headers), whose bytes it
// hashes and counts (Imported) rather than keep, and which shows on the
// DataVolume as CDI shows it: phase PVCBound, ImportScheduled,
// ImportInProgress with status.progress ("45.00%"), then Succeeded (progress
// "100.0%"), and the conditions Bound, Ready and Running, derived from the
// importer's state on the PVC's annotations as CDI derives them. An importer
// that fails (an HTTP error, a connection or read error) leaves the
// DataVolume ImportInProgress with Running False, reason Error and the
// importer's termination message, and is restarted after a back-off that
// doubles from StepInterval up to 16 of them, each restart counted in
// status.restartCount, as the kubelet restarts CDI's importer pod; the
// Running condition turns True again once the server answers. It plays the
// garbage collector too: the PVC of a deleted DataVolume is deleted. Other
// sources are left alone, and no admission webhook checks a DataVolume.
type FakeCDI struct {
	client client.Client
	step   time.Duration
	ctx    context.Context
	http   *http.Client

	mu sync.Mutex
	// importers are the downloads running or finished and not yet
	// recorded, by DataVolume.
	importers map[types.UID]*importer
	// imported are the imports done, by the PVC's namespace and name.
	imported map[types.NamespacedName]Import
}

// importer is one run of a DataVolume's importer pod: its download.
type importer struct {
	mu sync.Mutex
	importerState

	// restartAt is when a failed importer is restarted; only the
	// reconciler reads and writes it.
	restartAt time.Time
}

// importerState is what an importer's download did so far.
type importerState struct {
	// total is the Content-Length, or -1; read is the bytes read.
	total, read int64
	// connected is set once the server answered 200 OK.
	connected bool
	// done is set once the download ended, err is why it failed, and sum
	// is the hex SHA-256 of a download that did not.
	done bool
	err  error
	sum  string
}

func (i *importer) state() importerState {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.importerState
}

// setupCDI registers the FakeCDI with mgr; its downloads stop with ctx.
func setupCDI(ctx context.Context, mgr ctrl.Manager, step time.Duration) (*FakeCDI, error) {
	c := &FakeCDI{
		client:    mgr.GetClient(),
		step:      step,
		ctx:       ctx,
		http:      &http.Client{Transport: &http.Transport{Proxy: nil}},
		importers: map[types.UID]*importer{},
		imported:  map[types.NamespacedName]Import{},
	}
	err := ctrl.NewControllerManagedBy(mgr).
		Named("fake-cdi-datavolume-controller").
		For(&cdiv1.DataVolume{}).
		Owns(&corev1.PersistentVolumeClaim{}).
		WithOptions(controller.Options{
			SkipNameValidation: ptr(true),
			LogConstructor:     func(*reconcile.Request) logr.Logger { return logr.Discard() },
			RateLimiter:        workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](10*time.Millisecond, time.Second),
		}).
		Complete(c)
	return c, errors.Wrap(err, "cannot set up the fake CDI")
}

// Imported reports what the FakeCDI downloaded into the PVC named nn,
// once its DataVolume has Succeeded: the bytes' digest and size. Real CDI
// records nothing of the kind; tests read it here.
func (c *FakeCDI) Imported(nn types.NamespacedName) (Import, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	i, ok := c.imported[nn]
	return i, ok
}

// Reconcile implements reconcile.Reconciler.
func (c *FakeCDI) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	dv := &cdiv1.DataVolume{}
	if err := c.client.Get(ctx, req.NamespacedName, dv); kerrors.IsNotFound(err) {
		return reconcile.Result{}, c.collect(ctx, req.NamespacedName)
	} else if err != nil {
		return reconcile.Result{}, err
	}
	if dv.DeletionTimestamp != nil || dv.Spec.Source == nil || dv.Spec.Source.HTTP == nil {
		return reconcile.Result{}, nil
	}
	pvc := &corev1.PersistentVolumeClaim{}
	switch err := c.client.Get(ctx, req.NamespacedName, pvc); {
	case kerrors.IsNotFound(err):
		pvc = nil
	case err != nil:
		return reconcile.Result{}, err
	case !metav1.IsControlledBy(pvc, dv):
		// Someone else's PVC: CDI leaves it, and the DataVolume, alone.
		return reconcile.Result{}, nil
	}
	again := reconcile.Result{RequeueAfter: c.step}
	if pvc == nil {
		pvc, err := newClaim(dv)
		if err != nil {
			return reconcile.Result{}, err
		}
		if err := c.client.Create(ctx, pvc); err != nil && !kerrors.IsAlreadyExists(err) {
			return reconcile.Result{}, errors.Wrap(err, "cannot create the DataVolume's PVC")
		}
		return again, c.updateStatus(ctx, dv, pvc)
	}
	if pvc.Status.Phase != corev1.ClaimBound {
		// The stand-in's provisioner binds every claim at once.
		pvc.Status.Phase = corev1.ClaimBound
		pvc.Status.AccessModes = pvc.Spec.AccessModes
		pvc.Status.Capacity = corev1.ResourceList{corev1.ResourceStorage: pvc.Spec.Resources.Requests[corev1.ResourceStorage]}
		if err := c.client.Status().Update(ctx, pvc); err != nil {
			return reconcile.Result{}, errors.Wrap(err, "cannot bind the DataVolume's PVC")
		}
		return again, c.updateStatus(ctx, dv, pvc)
	}
	next := pvc.DeepCopy()
	result, act := c.runImporter(dv, next)
	if !maps.Equal(pvc.Annotations, next.Annotations) {
		if err := c.client.Update(ctx, next); err != nil {
			return reconcile.Result{}, errors.Wrap(err, "cannot record the importer's state on the PVC")
		}
	}
	// Only once the PVC says so: a failed update is tried again with the
	// importer as it was.
	switch act {
	case importerStart:
		c.start(dv)
	case importerFinish:
		c.finish(dv, next)
	}
	return result, c.updateStatus(ctx, dv, next)
}

// newClaim is the PVC CDI makes for dv (newPersistentVolumeClaim).
func newClaim(dv *cdiv1.DataVolume) (*corev1.PersistentVolumeClaim, error) {
	labels := map[string]string{LabelCDIKey: LabelCDIValue}
	maps.Copy(labels, dv.Labels)
	annotations := maps.Clone(dv.Annotations)
	if annotations == nil {
		annotations = map[string]string{}
	}
	annotations[AnnPodRestarts] = "0"
	annotations[AnnContentType] = string(cmp.Or(dv.Spec.ContentType, cdiv1.DataVolumeKubeVirt))
	annotations[AnnCreatedForDataVolume] = string(dv.UID)
	annotations[AnnSource] = "http"
	annotations[AnnEndpoint] = dv.Spec.Source.HTTP.URL
	var spec corev1.PersistentVolumeClaimSpec
	switch {
	case dv.Spec.PVC != nil:
		spec = *dv.Spec.PVC.DeepCopy()
	case dv.Spec.Storage != nil:
		s := dv.Spec.Storage.DeepCopy()
		spec = corev1.PersistentVolumeClaimSpec{
			AccessModes:      s.AccessModes,
			Selector:         s.Selector,
			Resources:        s.Resources,
			VolumeName:       s.VolumeName,
			StorageClassName: s.StorageClassName,
			VolumeMode:       s.VolumeMode,
		}
	default:
		return nil, errors.Errorf("DataVolume %s/%s has neither spec.pvc nor spec.storage", dv.Namespace, dv.Name)
	}
	if len(spec.AccessModes) == 0 {
		spec.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}
	}
	if spec.VolumeMode == nil {
		spec.VolumeMode = ptr(corev1.PersistentVolumeFilesystem)
	}
	return &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: dv.Namespace, Name: dv.Name, Labels: labels, Annotations: annotations,
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(dv, cdiv1.SchemeGroupVersion.WithKind("DataVolume"))},
		},
		Spec: spec,
	}, nil
}

// importerAct is what the reconciler does with a DataVolume's importer once
// its state is on the PVC.
type importerAct int

const (
	importerKeep importerAct = iota
	// importerStart starts the importer, or restarts it after a failure.
	importerStart
	// importerFinish records what a successful importer imported.
	importerFinish
)

// runImporter moves the importer of dv one step, recording its state on
// the PVC's annotations as CDI's import controller records its pod's:
// scheduled, running, then succeeded, or failed and restarted after a
// back-off (the restart counted when it happens, as the kubelet counts a
// container's).
func (c *FakeCDI) runImporter(dv *cdiv1.DataVolume, pvc *corev1.PersistentVolumeClaim) (reconcile.Result, importerAct) {
	a := pvc.Annotations
	again := reconcile.Result{RequeueAfter: c.step}
	switch {
	case a[AnnPodPhase] == string(corev1.PodSucceeded):
		return reconcile.Result{}, importerKeep
	case a[AnnImportPod] == "":
		a[AnnImportPod] = "importer-" + pvc.Name
		a[AnnPodPhase] = string(corev1.PodPending)
		return again, importerKeep
	}
	c.mu.Lock()
	imp := c.importers[dv.UID]
	c.mu.Unlock()
	if imp == nil {
		a[AnnPodPhase] = string(corev1.PodRunning)
		return again, importerStart
	}
	st := imp.state()
	switch {
	case !st.done && st.connected:
		a[AnnRunningCondition], a[AnnRunningMessage], a[AnnRunningReason] = "true", "", ReasonPodRunning
		return again, importerKeep
	case !st.done:
		return again, importerKeep
	case st.err == nil:
		a[AnnPodPhase] = string(corev1.PodSucceeded)
		a[AnnRunningCondition], a[AnnRunningMessage], a[AnnRunningReason] = "false", msgImportComplete, ReasonCompleted
		return reconcile.Result{}, importerFinish
	}
	// The importer's container ended in an error; the pod stays Running
	// while the kubelet restarts the container.
	a[AnnRunningCondition], a[AnnRunningMessage], a[AnnRunningReason] = "false", st.err.Error(), ReasonError
	restarts, _ := strconv.Atoi(a[AnnPodRestarts])
	if imp.restartAt.IsZero() {
		imp.restartAt = time.Now().Add(min(c.step<<min(restarts, 4), 16*c.step))
	}
	if wait := time.Until(imp.restartAt); wait > 0 {
		return reconcile.Result{RequeueAfter: wait}, importerKeep
	}
	a[AnnPodRestarts] = strconv.Itoa(restarts + 1)
	return again, importerStart
}

// finish records what dv's importer imported into pvc.
func (c *FakeCDI) finish(dv *cdiv1.DataVolume, pvc *corev1.PersistentVolumeClaim) {
	c.mu.Lock()
	defer c.mu.Unlock()
	imp := c.importers[dv.UID]
	if imp == nil {
		return
	}
	st := imp.state()
	delete(c.importers, dv.UID)
	c.imported[types.NamespacedName{Namespace: pvc.Namespace, Name: pvc.Name}] = Import{DataVolume: dv.UID, URL: dv.Spec.Source.HTTP.URL, SHA256: st.sum, Size: st.read}
}

// start starts a run of dv's importer in the background.
func (c *FakeCDI) start(dv *cdiv1.DataVolume) *importer {
	imp := &importer{importerState: importerState{total: -1}}
	c.mu.Lock()
	c.importers[dv.UID] = imp
	c.mu.Unlock()
	go imp.run(c.ctx, c.http, dv.Spec.Source.HTTP.URL)
	return imp
}

// run downloads url, counting and hashing what arrives; its error is the
// termination message CDI's importer would write.
func (i *importer) run(ctx context.Context, hc *http.Client, url string) {
	err := func() error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return errors.New(msgCannotConnectPrefix + err.Error())
		}
		resp, err := hc.Do(req)
		if err != nil {
			return errors.New(msgCannotConnectPrefix + "HTTP request errored: " + err.Error())
		}
		defer func() { _ = resp.Body.Close() }()
		if resp.StatusCode != http.StatusOK {
			return errors.New(msgCannotConnectPrefix + fmt.Sprintf("expected status code %d, got %d. Status: %s", http.StatusOK, resp.StatusCode, resp.Status))
		}
		i.mu.Lock()
		i.total, i.connected = resp.ContentLength, true
		i.mu.Unlock()
		h := sha256.New()
		if _, err := io.Copy(&counter{h: h, i: i}, resp.Body); err != nil {
			return errors.New(msgCannotProcessPrefix + err.Error())
		}
		i.mu.Lock()
		i.sum = hex.EncodeToString(h.Sum(nil))
		i.mu.Unlock()
		return nil
	}()
	i.mu.Lock()
	i.done, i.err = true, err
	i.mu.Unlock()
}

// counter hashes what is written to it and counts it on its importer.
type counter struct {
	h hash.Hash
	i *importer
}

func (w *counter) Write(p []byte) (int, error) {
	n, _ := w.h.Write(p)
	w.i.mu.Lock()
	w.i.read += int64(n)
	w.i.mu.Unlock()
	return n, nil
}

// progress is the importer's progress as CDI's DataVolume controller
// formats the importer's metric, or "" when it cannot tell.
func (i *importer) progress() cdiv1.DataVolumeProgress {
	i.mu.Lock()
	defer i.mu.Unlock()
	if !i.connected || i.total <= 0 {
		return ""
	}
	return cdiv1.DataVolumeProgress(fmt.Sprintf("%.2f%%", float64(i.read)*100/float64(i.total)))
}

// collect plays the garbage collector for a DataVolume that is gone: the
// PVC it controlled goes too, and so does its importer.
func (c *FakeCDI) collect(ctx context.Context, nn types.NamespacedName) error {
	pvc := &corev1.PersistentVolumeClaim{}
	if err := c.client.Get(ctx, nn, pvc); kerrors.IsNotFound(err) {
		return nil
	} else if err != nil {
		return err
	}
	owner := metav1.GetControllerOf(pvc)
	if owner == nil || owner.Kind != "DataVolume" || owner.APIVersion != cdiv1.SchemeGroupVersion.String() {
		return nil
	}
	dv := &cdiv1.DataVolume{}
	if err := c.client.Get(ctx, nn, dv); err == nil && dv.UID == owner.UID {
		return nil
	}
	c.mu.Lock()
	delete(c.importers, owner.UID)
	delete(c.imported, nn)
	c.mu.Unlock()
	err := c.client.Delete(ctx, pvc, client.Preconditions{UID: &pvc.UID})
	return errors.Wrap(client.IgnoreNotFound(err), "cannot delete the PVC of a deleted DataVolume")
}

// updateStatus writes dv's status as CDI's DataVolume controller derives
// it from its PVC (nil while there is none): the phase, the claim, the
// restart count, the progress and the conditions Bound, Ready and Running.
func (c *FakeCDI) updateStatus(ctx context.Context, dv *cdiv1.DataVolume, pvc *corev1.PersistentVolumeClaim) error {
	want := dv.Status.DeepCopy()
	switch {
	case pvc == nil || pvc.Status.Phase == "" || pvc.Status.Phase == corev1.ClaimPending:
		want.Phase = cdiv1.Pending
	default:
		want.ClaimName = pvc.Name
		a := pvc.Annotations
		if want.Phase == cdiv1.Pending || want.Phase == cdiv1.PhaseUnset {
			want.Phase = cdiv1.PVCBound
		}
		if a[AnnImportPod] != "" {
			// The import controller's updateStatusPhase.
			want.Phase = cdiv1.ImportScheduled
			switch corev1.PodPhase(a[AnnPodPhase]) {
			case corev1.PodRunning:
				want.Phase = cdiv1.ImportInProgress
			case corev1.PodSucceeded:
				want.Phase, want.Progress = cdiv1.Succeeded, "100.0%"
			}
		}
		if n, err := strconv.ParseInt(a[AnnPodRestarts], 10, 32); err == nil && n >= 0 {
			want.RestartCount = int32(n)
		}
		if want.Progress == "" {
			want.Progress = "N/A"
		}
		if want.Phase == cdiv1.ImportInProgress {
			c.mu.Lock()
			imp := c.importers[dv.UID]
			c.mu.Unlock()
			if imp != nil {
				if p := imp.progress(); p != "" {
					want.Progress = p
				}
			}
		}
	}
	want.Conditions = conditions(want.Conditions, want.Phase, pvc)
	if equalDataVolumeStatus(dv.Status, *want) {
		return nil
	}
	dv.Status = *want
	return errors.Wrap(c.client.Status().Update(ctx, dv), "cannot update the DataVolume's status")
}

// conditions are CDI's updateConditions: Bound from the PVC's phase, Ready
// from the DataVolume's, Running from the importer's state on the PVC.
func conditions(cs []cdiv1.DataVolumeCondition, phase cdiv1.DataVolumePhase, pvc *corev1.PersistentVolumeClaim) []cdiv1.DataVolumeCondition {
	cs = slices.Clone(cs)
	anno := map[string]string{}
	switch {
	case pvc == nil:
		cs = setCondition(cs, cdiv1.DataVolumeBound, corev1.ConditionFalse, "No PVC found", "NotFound")
	case pvc.Status.Phase == corev1.ClaimBound:
		anno = pvc.Annotations
		cs = setCondition(cs, cdiv1.DataVolumeBound, corev1.ConditionTrue, fmt.Sprintf("PVC %s Bound", pvc.Name), "Bound")
	default:
		anno = pvc.Annotations
		cs = setCondition(cs, cdiv1.DataVolumeBound, corev1.ConditionFalse, fmt.Sprintf("PVC %s Pending", pvc.Name), "Pending")
	}
	ready := corev1.ConditionFalse
	if phase == cdiv1.Succeeded {
		ready = corev1.ConditionTrue
	}
	cs = setCondition(cs, cdiv1.DataVolumeReady, ready, "", "")
	if strings.EqualFold(anno[AnnRunningCondition], "true") {
		cs = setCondition(cs, cdiv1.DataVolumeRunning, corev1.ConditionTrue, anno[AnnRunningMessage], anno[AnnRunningReason])
		cs = setCondition(cs, cdiv1.DataVolumeReady, corev1.ConditionFalse, "", "TransferRunning")
	} else {
		cs = setCondition(cs, cdiv1.DataVolumeRunning, corev1.ConditionFalse, anno[AnnRunningMessage], anno[AnnRunningReason])
	}
	return cs
}

// setCondition is CDI's updateCondition: the transition time changes with
// the status only.
func setCondition(cs []cdiv1.DataVolumeCondition, t cdiv1.DataVolumeConditionType, status corev1.ConditionStatus, message, reason string) []cdiv1.DataVolumeCondition {
	i := -1
	for j := range cs {
		if cs[j].Type == t {
			i = j
		}
	}
	if i < 0 {
		cs = append(cs, cdiv1.DataVolumeCondition{Type: t})
		i = len(cs) - 1
	}
	cond := &cs[i]
	if cond.Status != status {
		cond.LastTransitionTime = metav1.Now()
		cond.LastHeartbeatTime = cond.LastTransitionTime
	} else if cond.Message != message || cond.Reason != reason {
		cond.LastHeartbeatTime = metav1.Now()
	}
	cond.Status, cond.Message, cond.Reason = status, message, reason
	return cs
}

func equalDataVolumeStatus(a, b cdiv1.DataVolumeStatus) bool {
	if a.Phase != b.Phase || a.ClaimName != b.ClaimName || a.Progress != b.Progress || a.RestartCount != b.RestartCount || len(a.Conditions) != len(b.Conditions) {
		return false
	}
	for i := range a.Conditions {
		x, y := a.Conditions[i], b.Conditions[i]
		if x.Type != y.Type || x.Status != y.Status || x.Reason != y.Reason || x.Message != y.Message {
			return false
		}
	}
	return true
}
