package bus

import (
	"context"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
)

// Event is the state of one of this node's intents of one kind.
type Event[V any] struct {
	UID      string
	Revision uint64
	// Deleted means the hub removed the intent; Value is then zero.
	Deleted bool
	Value   V
}

// Handler takes the intents of one kind; On makes one.
type Handler struct {
	uid  func(rest string) (string, bool)
	take func(e entry, node, uid string) error
}

// On is the Handler that decodes the intents of kind k and hands them to fn.
func On[V any](k wire.Kind[V], fn func(Event[V])) Handler {
	return Handler{uid: k.UID, take: func(e entry, node, uid string) error {
		ev := Event[V]{UID: uid, Revision: e.revision, Deleted: e.deleted}
		if !e.deleted {
			var err error
			if ev.Value, err = k.DecodeAt(e.key, node, uid, e.value); err != nil {
				return err
			}
		}
		fn(ev)
		return nil
	}}
}

// Handlers are what WatchIntents delivers to.
type Handlers struct {
	// Kinds take the intents of their kinds; an intent of a kind none of
	// them takes is refused.
	Kinds []Handler
	// Synced, if set, is called once the intents there were when the watch
	// started, or resumed, have been delivered.
	Synced func()
}

// entry is the state of one key of the intents bucket.
type entry struct {
	key      string
	revision uint64
	// deleted is a removed key; value is then empty.
	deleted bool
	value   []byte
}

// deliver hands e, a key of node's, to the handler of its kind.
func (hs Handlers) deliver(node string, e entry) error {
	got, rest, err := wire.ParseKey(e.key)
	if err != nil {
		return err
	}
	if got != node {
		return &wire.MismatchError{Key: e.key, Want: node, Got: got}
	}
	for _, h := range hs.Kinds {
		if uid, ok := h.uid(rest); ok {
			return h.take(e, node, uid)
		}
	}
	return &wire.KeyError{What: "key", Value: e.key, Reason: "no kind of intent this agent handles"}
}

func (hs Handlers) synced() {
	if hs.Synced != nil {
		hs.Synced()
	}
}

// PutReport stores v as the report of kind k of uid on b's node. A value
// whose identity is not its key's, which the hub would refuse (see
// wire.Kind.Check), is refused here before it is sent.
func PutReport[V any](ctx context.Context, b Reports, k wire.Kind[V], uid string, v V) (revision uint64, err error) {
	key, err := reportKey(b, k, uid)
	if err != nil {
		return 0, err
	}
	if err := k.Check(key, b.Node(), uid, v); err != nil {
		return 0, err
	}
	value, err := k.Encode(v)
	if err != nil {
		return 0, errors.Wrapf(err, "cannot encode %s", k.Name)
	}
	return b.Put(ctx, key, value)
}

// DeleteReport removes the report of kind k of uid from b's node.
func DeleteReport[V any](ctx context.Context, b Reports, k wire.Kind[V], uid string) error {
	key, err := reportKey(b, k, uid)
	if err != nil {
		return err
	}
	return b.Delete(ctx, key)
}

// GetReport is the report of kind k of uid stored on b's node, and
// whether there is one.
func GetReport[V any](ctx context.Context, b Reports, k wire.Kind[V], uid string) (V, bool, error) {
	var v V
	key, err := reportKey(b, k, uid)
	if err != nil {
		return v, false, err
	}
	value, err := b.Get(ctx, key)
	if err != nil || len(value) == 0 {
		return v, false, err
	}
	if v, err = k.DecodeAt(key, b.Node(), uid, value); err != nil {
		return v, false, errors.Wrapf(err, "cannot read %s %s", k.Name, uid)
	}
	return v, true, nil
}

func reportKey[V any](b Reports, k wire.Kind[V], uid string) (string, error) {
	if k.Bucket != wire.BucketReports {
		return "", errors.Errorf("a %s is not a report: it belongs in bucket %s", k.Name, k.Bucket)
	}
	return k.Key(b.Node(), uid)
}

// ownKey refuses with a *wire.KeyError a key that is not node's: the server
// would refuse it only by not answering.
func ownKey(node, key string) error {
	got, _, err := wire.ParseKey(key)
	if err == nil && got != node {
		err = &wire.KeyError{What: "key", Value: key, Reason: "not a key of node " + node}
	}
	return err
}
