package v1alpha1

import (
	"reflect"
	"strings"
	"time"
)

// Kind declares one kind of per-node value: the bucket it is stored in, the
// key token that sets its keys apart from the node's other keys, its codec,
// the identity it carries, and when two of them say the same. Hub and agent
// handle every kind through its declaration, so a new kind of value on the
// wire is a new declaration, not a new branch in their plumbing.
type Kind[V any] struct {
	// Name names the kind in errors and logs, e.g. "volume report".
	Name string
	// Bucket is the bucket its values are stored in.
	Bucket string
	// Token sets the kind's keys apart: "<node>.<token>.<uid>". The guests'
	// keys have none, "<node>.<uid>", which a token can never be mistaken
	// for: their rest has one subject token, the others' two.
	Token string
	// Encode stamps the protocol version and encodes a valid value.
	Encode func(V) ([]byte, error)
	// Decode decodes and validates a value.
	Decode func([]byte) (V, error)
	// Identity is what a value says of itself: the uid it is about and,
	// when it names one, the node it comes from (node is then not ""). A
	// value whose identity is not its key's is refused. Nil for a kind
	// whose values name nothing.
	Identity func(V) (node, uid string)
	// Same is whether two values say the same, so that a writer holding a
	// need not write b; nil compares them whole.
	Same func(a, b V) bool
}

// The kinds of per-node values.
var (
	// GuestIntents are what the hub wants of each guest of a node.
	GuestIntents = Kind[Intent]{
		Name: "intent", Bucket: BucketIntents,
		Encode: EncodeIntent, Decode: DecodeIntent,
		Identity: func(in Intent) (string, string) { return "", in.UID },
	}
	// GuestReports are what a node observes of each of its guests.
	GuestReports = Kind[Report]{
		Name: "report", Bucket: BucketReports,
		Encode: EncodeReport, Decode: DecodeReport,
		Identity: func(r Report) (string, string) { return r.Node, r.UID },
		Same:     sameReport,
	}
	// VolumeIntents are what the hub wants of each Volume bound to a node.
	VolumeIntents = Kind[VolumeIntent]{
		Name: "volume intent", Bucket: BucketIntents, Token: volumeToken,
		Encode: EncodeVolumeIntent, Decode: DecodeVolumeIntent,
		Identity: func(v VolumeIntent) (string, string) { return "", v.UID },
	}
	// VolumeReports are what a node observes of each Volume bound to it.
	VolumeReports = Kind[VolumeReport]{
		Name: "volume report", Bucket: BucketReports, Token: volumeToken,
		Encode: EncodeVolumeReport, Decode: DecodeVolumeReport,
		Identity: func(v VolumeReport) (string, string) { return "", v.UID },
		Same:     sameVolumeReport,
	}
	// ImageReports are what a node holds of each DiskImage.
	ImageReports = Kind[ImageReport]{
		Name: "image report", Bucket: BucketReports, Token: imageToken,
		Encode: EncodeImageReport, Decode: DecodeImageReport,
		Identity: func(r ImageReport) (string, string) { return r.Node, r.UID },
		Same:     sameImageReport,
	}
	// Fabrics are each node's view of its overlay peers, one per node
	// under the uid FabricUID.
	Fabrics = Kind[Fabric]{
		Name: "fabric", Bucket: BucketIntents, Token: fabricToken,
		Encode: EncodeFabric, Decode: DecodeFabric,
	}
)

// FabricUID is the uid of a node's one Fabric key: "<node>.fabric.peers".
const FabricUID = "peers"

// Key is the key of the value of uid on node.
func (k Kind[V]) Key(node, uid string) (string, error) {
	return joinKey(node, k.Token, uid)
}

// UID returns the uid of a per-node key's rest (as ParseKey returns it) and
// true when the key is of this kind.
func (k Kind[V]) UID(rest string) (string, bool) {
	uid := rest
	if k.Token != "" {
		var ok bool
		if uid, ok = strings.CutPrefix(rest, k.Token+"."); !ok {
			return "", false
		}
	}
	if ValidateToken("uid", uid) != nil {
		return "", false
	}
	return uid, true
}

// DecodeAt decodes the value stored under key, which ParseKey and UID split
// into node and uid, and refuses with a *MismatchError one whose Identity
// is not the key's: only a node's agent may write under its prefix, so a
// mismatch is a bug or a forgery and must not act.
func (k Kind[V]) DecodeAt(key, node, uid string, value []byte) (V, error) {
	v, err := k.Decode(value)
	if err != nil {
		return v, err
	}
	return v, k.Check(key, node, uid, v)
}

// Check refuses with a *MismatchError a value whose Identity is not that of
// key, the key of uid on node: a writer checks before it writes what a
// reader would refuse.
func (k Kind[V]) Check(key, node, uid string, v V) error {
	if k.Identity == nil {
		return nil
	}
	gotNode, gotUID := k.Identity(v)
	want, got := uid, gotUID
	if gotNode != "" {
		want, got = node+"."+uid, gotNode+"."+gotUID
	}
	if got != want {
		return &MismatchError{Key: key, Want: want, Got: got}
	}
	return nil
}

// Equal is whether a and b say the same (Same, or whole).
func (k Kind[V]) Equal(a, b V) bool {
	if k.Same != nil {
		return k.Same(a, b)
	}
	return reflect.DeepEqual(a, b)
}

// MismatchError is a value stored under a key that is not its own.
type MismatchError struct {
	Key, Want, Got string
}

func (e *MismatchError) Error() string {
	return "value under key " + e.Key + " names " + e.Got + ", want " + e.Want
}

// sameReport leaves out when a report was observed and when each address
// was last seen: they change on every look, and would turn every resync
// into a write per guest.
func sameReport(a, b Report) bool {
	a.ObservedAt, b.ObservedAt = time.Time{}, time.Time{}
	a.ProtocolVersion, b.ProtocolVersion = 0, 0
	a.Interfaces, b.Interfaces = withoutLastSeen(a.Interfaces), withoutLastSeen(b.Interfaces)
	return reflect.DeepEqual(a, b)
}

func withoutLastSeen(in []Interface) []Interface {
	if in == nil {
		return nil
	}
	out := make([]Interface, len(in))
	for i, iface := range in {
		iface.LastSeen = time.Time{}
		out[i] = iface
	}
	return out
}

func sameVolumeReport(a, b VolumeReport) bool {
	a.ObservedAt, b.ObservedAt = time.Time{}, time.Time{}
	a.ProtocolVersion, b.ProtocolVersion = 0, 0
	return reflect.DeepEqual(a, b)
}

func sameImageReport(a, b ImageReport) bool {
	a.ObservedAt, b.ObservedAt = time.Time{}, time.Time{}
	a.ProtocolVersion, b.ProtocolVersion = 0, 0
	return a == b
}
