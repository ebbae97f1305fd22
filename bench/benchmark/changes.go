package benchmark

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
)

// watchedKinds are the kinds whose objects a restart's changes are read
// of: the ones a VM's reconcile writes.
var watchedKinds = []schema.GroupVersionKind{
	v1alpha1.VirtualMachineGroupVersionKind.GroupVersion().WithKind(v1alpha1.VirtualMachineKind + "List"),
	v1alpha1.VolumeGroupVersionKind.GroupVersion().WithKind(v1alpha1.VolumeKind + "List"),
}

// objectsSnapshot is every object of watchedKinds as JSON without its
// managedFields, by kind and uid. JSON, not the decoded maps, keeps two
// snapshots of a fleet of a hundred thousand VMs within the memory the
// control plane leaves; an object no write touched has the same bytes.
type objectsSnapshot map[string]map[string][]byte

// listPage is how many objects one request of snapshotObjects lists. One
// response holding a whole fleet's objects can take the API server past
// its request timeout while it serves the fleet; pages are each short.
const listPage = 1000

// snapshotObjects lists every object of watchedKinds, a page at a time.
func snapshotObjects(ctx context.Context, kube client.Client) (objectsSnapshot, error) {
	out := objectsSnapshot{}
	for _, gvk := range watchedKinds {
		kind := strings.TrimSuffix(gvk.Kind, "List")
		out[kind] = map[string][]byte{}
		for next := ""; ; {
			l := &unstructured.UnstructuredList{}
			l.SetGroupVersionKind(gvk)
			if err := kube.List(ctx, l, client.Limit(listPage), client.Continue(next)); err != nil {
				return nil, errors.Wrapf(err, "cannot list %s", gvk.Kind)
			}
			for _, o := range l.Items {
				o.SetManagedFields(nil)
				b, err := json.Marshal(o.Object)
				if err != nil {
					return nil, errors.Wrapf(err, "cannot encode %s %s", kind, o.GetName())
				}
				out[kind][string(o.GetUID())] = b
			}
			if next = l.GetContinue(); next == "" {
				break
			}
		}
	}
	return out, nil
}

// changedFields counts, over the objects whose resourceVersion differs
// between before and after, the fields that differ, by kind and path
// ("Volume status.atProvider.attachedTo"). A list of maps with a "type"
// (conditions) is read by type; metadata.resourceVersion and
// metadata.managedFields are left out: every write changes them.
func changedFields(before, after objectsSnapshot) (map[string]int, error) {
	out := map[string]int{}
	for kind, objects := range after {
		for uid, b := range objects {
			a, ok := before[kind][uid]
			if !ok || bytes.Equal(a, b) {
				continue
			}
			var old, o map[string]any
			if err := json.Unmarshal(a, &old); err != nil {
				return nil, errors.Wrapf(err, "cannot decode %s %s", kind, uid)
			}
			if err := json.Unmarshal(b, &o); err != nil {
				return nil, errors.Wrapf(err, "cannot decode %s %s", kind, uid)
			}
			for _, p := range diffPaths("", old, o) {
				if p == "metadata.resourceVersion" || strings.HasPrefix(p, "metadata.managedFields") {
					continue
				}
				out[kind+" "+p]++
			}
		}
	}
	return out, nil
}

// diffPaths are the paths under prefix at which a and b differ.
func diffPaths(prefix string, a, b any) []string {
	join := func(k string) string {
		if prefix == "" {
			return k
		}
		return prefix + "." + k
	}
	am, aok := a.(map[string]any)
	bm, bok := b.(map[string]any)
	if aok && bok {
		var out []string
		for _, k := range slices.Sorted(maps.Keys(union(am, bm))) {
			out = append(out, diffPaths(join(k), am[k], bm[k])...)
		}
		return out
	}
	at, aTyped := byType(a)
	bt, bTyped := byType(b)
	if aTyped && bTyped {
		var out []string
		for _, k := range slices.Sorted(maps.Keys(union(at, bt))) {
			out = append(out, diffPaths(prefix+"["+k+"]", at[k], bt[k])...)
		}
		return out
	}
	if reflect.DeepEqual(a, b) {
		return nil
	}
	return []string{prefix}
}

func union(a, b map[string]any) map[string]any {
	out := maps.Clone(a)
	maps.Copy(out, b)
	return out
}

// byType is a list of maps keyed by their "type", if v is one.
func byType(v any) (map[string]any, bool) {
	l, ok := v.([]any)
	if !ok || len(l) == 0 {
		return nil, false
	}
	out := map[string]any{}
	for _, e := range l {
		m, ok := e.(map[string]any)
		t, typed := m["type"].(string)
		if !ok || !typed {
			return nil, false
		}
		out[t] = m
	}
	return out, true
}

// eventReasons counts the events recorded or repeated since, by their
// involved object's kind and reason ("VirtualMachine Started"), with one
// message of each Warning's.
func eventReasons(ctx context.Context, kube client.Client, since time.Time) (map[string]int, map[string]string, error) {
	l := &corev1.EventList{}
	if err := kube.List(ctx, l); err != nil {
		return nil, nil, errors.Wrap(err, "cannot list events")
	}
	out, warnings := map[string]int{}, map[string]string{}
	for _, e := range l.Items {
		last := e.LastTimestamp.Time
		if e.Series != nil {
			last = e.Series.LastObservedTime.Time
		}
		if last.IsZero() {
			last = e.EventTime.Time
		}
		// Event times have a resolution of one second.
		if last.Before(since.Truncate(time.Second)) {
			continue
		}
		key := fmt.Sprintf("%s %s", e.InvolvedObject.Kind, e.Reason)
		out[key]++
		if e.Type == corev1.EventTypeWarning {
			warnings[key] = e.Message
		}
	}
	return out, warnings, nil
}
