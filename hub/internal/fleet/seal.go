package fleet

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
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

// Sealed says whether obj's node (and adopted orphan) annotations are the
// hub's own placement.
func (f *Fleet) Sealed(obj metav1.Object) bool {
	a := obj.GetAnnotations()
	want := f.Seal(string(obj.GetUID()), a[v1alpha1.AnnotationNode], a[v1alpha1.AnnotationAdopted])
	return hmac.Equal([]byte(a[v1alpha1.AnnotationSeal]), []byte(want))
}
