package fleet

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"strconv"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
)

// sealContext keeps a seal's key apart from any other use of the seed.
const sealContext = "virtfleet.io placement seal v1"

// sealKey is the key the hub seals its placements with in a fleet: derived
// from the hub's NATS seed, which neither tenants nor agents hold. A fleet
// without credentials has a key anyone can derive; such a NATS server lets
// anyone write intents anyway, so it isolates no tenant.
func sealKey(t Target) []byte {
	m := hmac.New(sha256.New, t.Seed)
	m.Write([]byte(sealContext))
	m.Write([]byte(t.URL))
	return m.Sum(nil)
}

// WithSealKey makes f seal placements with a key of its own; Pool.Get gives
// each fleet the key of its target.
func (f *Fleet) WithSealKey(key []byte) *Fleet {
	f.sealKey = key
	return f
}

// Seal is the hub's mark on a placement it made: the object's node (and
// the orphan it adopts) under the object's uid. A tenant can write
// annotations but cannot make the mark: a node annotation without it was
// not set by the hub's placement, and is honoured only where a cluster
// administrator granted its namespace to choose nodes.
func (f *Fleet) Seal(uid, node, adopted string) string {
	m := hmac.New(sha256.New, f.sealKey)
	m.Write([]byte(strings.Join([]string{uid, node, adopted}, "\x00")))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// OrphanSeal is the hub's mark on the release of guest uid on node from
// the VM namespace/name: the release marker carries it, the node keeps it
// with the orphan and reports it.
func (f *Fleet) OrphanSeal(uid, node, namespace, name string) string {
	return f.Seal(uid, node, "orphan of "+namespace+"/"+name)
}

// BindingSeal is the hub's mark on a VirtualMachine's binding made at
// epoch: Seal, with the epoch too, so that the mark of one binding never
// stands for a later one. Epoch 0 is a binding sealed before epochs.
func (f *Fleet) BindingSeal(uid, node, adopted string, epoch int64) string {
	if epoch == 0 {
		return f.Seal(uid, node, adopted)
	}
	return f.Seal(uid, node, adopted+"\x00epoch "+strconv.FormatInt(epoch, 10))
}

// Bind records in a, vm's annotations, the binding of vm to node (and the
// orphan adopted) the hub makes now: sealed, at an epoch past every one
// vm held, so none of their seals is taken for it.
func (f *Fleet) Bind(vm *v1alpha1.VirtualMachine, a map[string]string, node, adopted string) {
	epoch := f.now().UnixNano()
	if b := f.held(string(vm.UID)); b != nil && epoch <= b.Epoch {
		epoch = b.Epoch + 1
	}
	if e, err := bindingEpoch(a); err == nil && epoch <= e {
		epoch = e + 1
	}
	a[v1alpha1.AnnotationNode] = node
	a[v1alpha1.AnnotationBindingEpoch] = strconv.FormatInt(epoch, 10)
	a[v1alpha1.AnnotationSeal] = f.BindingSeal(string(vm.UID), node, adopted, epoch)
	if adopted == "" {
		delete(a, v1alpha1.AnnotationAdopted)
	} else {
		a[v1alpha1.AnnotationAdopted] = adopted
	}
}

// bindingEpoch is the epoch the annotations a record; 0 where none.
func bindingEpoch(a map[string]string) (int64, error) {
	v, ok := a[v1alpha1.AnnotationBindingEpoch]
	if !ok {
		return 0, nil
	}
	return strconv.ParseInt(v, 10, 64)
}

// sealedBinding says whether obj's node (and adopted orphan) annotations
// carry the hub's seal, and at which epoch.
func (f *Fleet) sealedBinding(obj metav1.Object) (int64, bool) {
	a := obj.GetAnnotations()
	epoch, err := bindingEpoch(a)
	if err != nil {
		return 0, false
	}
	want := f.BindingSeal(string(obj.GetUID()), a[v1alpha1.AnnotationNode], a[v1alpha1.AnnotationAdopted], epoch)
	return epoch, hmac.Equal([]byte(a[v1alpha1.AnnotationSeal]), []byte(want))
}

// Sealed says whether obj's node (and adopted orphan) annotations are the
// hub's own placement. A VirtualMachine's is so only if it is its newest
// (Replayed): a tenant who copies back the annotations of an earlier
// binding copies a true seal, of a binding the VM no longer holds.
func (f *Fleet) Sealed(obj metav1.Object) bool {
	_, ok := f.sealedBinding(obj)
	return ok && !f.Replayed(obj)
}

// Replayed says whether obj is a VirtualMachine whose annotations carry
// the seal of a binding older than the newest the hub recorded for it
// (Held), one copied back by hand. Until the records are read it says
// false: what acts on a binding asks Held first.
func (f *Fleet) Replayed(obj metav1.Object) bool {
	if _, ok := obj.(*v1alpha1.VirtualMachine); !ok {
		return false
	}
	b := f.held(string(obj.GetUID()))
	if b == nil {
		return false
	}
	epoch, sealed := f.sealedBinding(obj)
	a := obj.GetAnnotations()
	return sealed && (epoch < b.Epoch || (epoch == b.Epoch && (a[v1alpha1.AnnotationNode] != b.Node || a[v1alpha1.AnnotationAdopted] != b.Adopted)))
}

// Binding is the sealed binding vm's annotations hold, to Record;
// nil unless Sealed.
func (f *Fleet) Binding(vm *v1alpha1.VirtualMachine) *v1alpha1.Binding {
	epoch, sealed := f.sealedBinding(vm)
	if !sealed || f.Replayed(vm) {
		return nil
	}
	a := vm.GetAnnotations()
	return &v1alpha1.Binding{Node: a[v1alpha1.AnnotationNode], Adopted: a[v1alpha1.AnnotationAdopted], Epoch: epoch}
}

// Restore records in a, vm's annotations, the binding b it held, sealed
// again.
func (f *Fleet) Restore(vm *v1alpha1.VirtualMachine, a map[string]string, b v1alpha1.Binding) {
	a[v1alpha1.AnnotationNode] = b.Node
	a[v1alpha1.AnnotationSeal] = f.BindingSeal(string(vm.UID), b.Node, b.Adopted, b.Epoch)
	if b.Epoch == 0 {
		delete(a, v1alpha1.AnnotationBindingEpoch)
	} else {
		a[v1alpha1.AnnotationBindingEpoch] = strconv.FormatInt(b.Epoch, 10)
	}
	if b.Adopted == "" {
		delete(a, v1alpha1.AnnotationAdopted)
	} else {
		a[v1alpha1.AnnotationAdopted] = b.Adopted
	}
}
