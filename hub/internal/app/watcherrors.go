package app

import (
	"context"
	"errors"
	"io"
	"sync"
	"time"

	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/event"
	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"

	"github.com/virtfleet/virtfleet/internal/metrics"
)

// ReasonUndecodable is the Warning event of an object the hub cannot decode.
const ReasonUndecodable event.Reason = "Undecodable"

// diagnoseEvery bounds how often the objects of one kind are listed again
// to find the ones the hub cannot decode: the informer retries its list
// with a backoff, and each retry fails the same way.
const diagnoseEvery = 30 * time.Second

// watchErrors is the hub's informers' WatchErrorHandler. It says at the
// default log level, once per cause, why an informer cannot list or watch.
// When the list itself failed, usually because one object of the kind does
// not decode into the hub's types (a CRD of another version of virtfleet
// let it in), no object of the kind reaches the hub until that object is
// fixed or deleted, so it finds those objects and names each one in the log,
// in a Warning event on it and in virtfleet_hub_undecodable_objects_total.
type watchErrors struct {
	log      logging.Logger
	reader   client.Reader
	decoder  runtime.Decoder
	scheme   *runtime.Scheme
	recorder event.Recorder
	// kinds maps an informer's type description ("*v1alpha1.VirtualMachine")
	// to its kind.
	kinds map[string]schema.GroupVersionKind

	mu        sync.Mutex
	said      map[string]bool
	diagnosed map[string]time.Time
}

// newWatchErrors handles the watch errors of informers of scheme's types.
// Its reader and recorder are set once the manager that needs the handler
// exists, before the informers start.
func newWatchErrors(log logging.Logger, scheme *runtime.Scheme) *watchErrors {
	w := &watchErrors{
		log: log, scheme: scheme,
		decoder:   serializer.NewCodecFactory(scheme).UniversalDeserializer(),
		kinds:     map[string]schema.GroupVersionKind{},
		said:      map[string]bool{},
		diagnosed: map[string]time.Time{},
	}
	for gvk, t := range scheme.AllKnownTypes() {
		w.kinds["*"+t.String()] = gvk
	}
	return w
}

// Handle is a toolscache.WatchErrorHandlerWithContext.
func (w *watchErrors) Handle(ctx context.Context, r *toolscache.Reflector, err error) {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || kerrors.IsResourceExpired(err) || kerrors.IsGone(err) || ctx.Err() != nil {
		return // a watch that ended as watches do; the informer resumes
	}
	what := r.TypeDescription()
	if w.first(what + "\x00" + err.Error()) {
		w.log.Info("Cannot list or watch; the hub retries, and sees no change of this kind meanwhile", "type", what, "error", err)
	}
	gvk, ok := w.kinds[what]
	var status kerrors.APIStatus
	if !ok || errors.As(err, &status) || !w.due(what) {
		return // not ours, or the API server refused: nothing to decode
	}
	w.diagnose(ctx, gvk)
}

// diagnose lists the objects of gvk without decoding them into the hub's
// types, then decodes each, and names every one that fails.
func (w *watchErrors) diagnose(ctx context.Context, gvk schema.GroupVersionKind) {
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
	if err := w.reader.List(ctx, list); err != nil {
		w.log.Debug("Cannot list to find undecodable objects", "kind", gvk.Kind, "error", err)
		return
	}
	for i := range list.Items {
		u := &list.Items[i]
		raw, err := u.MarshalJSON()
		if err != nil {
			continue
		}
		obj, err := w.scheme.New(gvk)
		if err != nil {
			return
		}
		if _, _, err = w.decoder.Decode(raw, nil, obj); err == nil {
			continue
		}
		if !w.first(gvk.Kind + "\x00" + u.GetNamespace() + "/" + u.GetName() + "@" + u.GetResourceVersion()) {
			continue
		}
		metrics.UndecodableObjects.WithLabelValues(gvk.Kind).Inc()
		w.log.Info("Cannot decode an object: until it is fixed or deleted, the hub sees no change of any object of its kind",
			"kind", gvk.Kind, "namespace", u.GetNamespace(), "name", u.GetName(), "error", err)
		w.recorder.Event(u, event.Warning(ReasonUndecodable, errors.New("the hub cannot decode this object, and sees no change of any "+gvk.Kind+" until it is fixed or deleted: "+err.Error())))
	}
}

// maxSaid bounds the causes remembered; past it they may be said again.
const maxSaid = 1000

// first is whether key is new.
func (w *watchErrors) first(key string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.said[key] {
		return false
	}
	if len(w.said) >= maxSaid {
		clear(w.said)
	}
	w.said[key] = true
	return true
}

// due is whether the objects of type what may be listed again.
func (w *watchErrors) due(what string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if time.Since(w.diagnosed[what]) < diagnoseEvery {
		return false
	}
	w.diagnosed[what] = time.Now()
	return true
}
