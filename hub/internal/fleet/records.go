package fleet

import (
	"context"
	"crypto/sha256"
	"sync"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/bus"
)

// ErrRecordsNotSynced is returned while the hub has not read its own
// records in the intents bucket: until then it cannot tell a replayed
// binding from the newest one, nor a Volume's size in effect.
var ErrRecordsNotSynced = errors.New("the hub has not read its records in the intents bucket yet")

// records are the hub's own records, kept in the intents bucket, where
// only the hub writes: the newest binding it sealed for each
// VirtualMachine (wire.BindingRecord) and the size in effect of each
// Volume it sized (wire.VolumeSizeRecord). A VM's status shows its
// binding as well, and a Volume's its size, but a tenant who may edit an
// object may write its status too (Crossplane's aggregated edit role
// grants */status): what status says is for users to read, and the hub
// never takes it from there.
type records struct {
	mu sync.RWMutex
	// held are the VMs' bindings, by uid.
	held map[string]v1alpha1.Binding
	// sizes are the sizes in effect of Volumes, by uid.
	sizes  map[string]int64
	synced bool
	// found are the digests of the guest intents the bucket held when
	// the hub first read it, by key, until the VM's reconcile asks
	// (FoundIntent).
	found map[string][sha256.Size]byte
}

// onIntent takes the hub's records among the intents bucket's entries;
// the intents themselves are the hub's own writes, and pass.
func (f *Fleet) onIntent(e bus.Entry) error {
	b := &f.records
	if e.Synced {
		b.mu.Lock()
		b.synced = true
		b.mu.Unlock()
		return nil
	}
	if uid, ok := wire.SizeUID(e.Key); ok {
		return f.onSize(e, uid)
	}
	uid, ok := wire.BindingUID(e.Key)
	if !ok {
		f.onGuestIntent(e)
		return nil
	}
	if e.Deleted {
		b.mu.Lock()
		delete(b.held, uid)
		b.mu.Unlock()
		return nil
	}
	r, err := wire.DecodeBindingRecord(e.Value)
	if err != nil {
		return err
	}
	if r.UID != uid {
		return &wire.KeyError{What: "binding record", Value: e.Key, Reason: "holds the binding of uid " + r.UID}
	}
	f.keep(uid, v1alpha1.Binding{Node: r.Node, Adopted: r.Adopted, Epoch: r.Epoch})
	return nil
}

// onGuestIntent keeps the digest of a guest intent the bucket holds as
// the hub first reads it; a later entry is the hub's own write, and only
// a deletion counts.
func (f *Fleet) onGuestIntent(e bus.Entry) {
	_, rest, err := wire.ParseKey(e.Key)
	if err != nil {
		return
	}
	if _, ok := wire.GuestIntents.UID(rest); !ok {
		return
	}
	b := &f.records
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case e.Deleted:
		delete(b.found, e.Key)
	case !b.synced:
		if b.found == nil {
			b.found = map[string][sha256.Size]byte{}
		}
		b.found[e.Key] = sha256.Sum256(e.Value)
	}
}

// FoundIntent says whether the bucket held value, the intent of uid on
// node as Put writes it (wire.GuestIntents.Encode), when the hub first
// read it: a hub that just started publishes nothing that the hub before
// it left as it should be. Each is answered once; then the hub's own
// record of what it published speaks.
func (f *Fleet) FoundIntent(node, uid string, value []byte) bool {
	key, err := wire.GuestIntents.Key(node, uid)
	if err != nil {
		return false
	}
	b := &f.records
	b.mu.Lock()
	defer b.mu.Unlock()
	found, ok := b.found[key]
	delete(b.found, key)
	return ok && found == sha256.Sum256(value)
}

// keep remembers bd as uid's binding unless a newer one is remembered: a
// record read back from the watch may be older than one just written.
func (f *Fleet) keep(uid string, bd v1alpha1.Binding) {
	b := &f.records
	b.mu.Lock()
	defer b.mu.Unlock()
	if cur, ok := b.held[uid]; ok && cur.Epoch > bd.Epoch {
		return
	}
	if b.held == nil {
		b.held = map[string]v1alpha1.Binding{}
	}
	b.held[uid] = bd
}

// Held is the newest binding the hub recorded for the VM of uid, nil for a
// VM it recorded none for; ErrRecordsNotSynced until the records are read.
func (f *Fleet) Held(uid string) (*v1alpha1.Binding, error) {
	b := &f.records
	b.mu.RLock()
	defer b.mu.RUnlock()
	if !b.synced {
		return nil, ErrRecordsNotSynced
	}
	bd, ok := b.held[uid]
	if !ok {
		return nil, nil
	}
	return &bd, nil
}

// held is Held without the error: nil also while the records are unread.
// Whatever acts on a binding asks Held first (see Replayed).
func (f *Fleet) held(uid string) *v1alpha1.Binding {
	bd, _ := f.Held(uid)
	return bd
}

// Record makes bd the binding the hub holds for the VM of uid, unless it
// holds a newer one. It is written before anything is published to bd's
// node, so a binding the hub acted on is always one it can restore.
func (f *Fleet) Record(ctx context.Context, uid string, bd v1alpha1.Binding) error {
	if cur := f.held(uid); cur != nil && (cur.Epoch > bd.Epoch || *cur == bd) {
		return nil
	}
	key, err := wire.BindingKey(uid)
	if err != nil {
		return err
	}
	v, err := wire.EncodeBindingRecord(wire.BindingRecord{UID: uid, Node: bd.Node, Adopted: bd.Adopted, Epoch: bd.Epoch})
	if err != nil {
		return err
	}
	if _, err := f.Bus.Put(ctx, wire.BucketIntents, key, v); err != nil {
		return errors.Wrapf(err, "cannot record the binding of VM %s", uid)
	}
	f.keep(uid, bd)
	return nil
}

// Unrecord removes the record of the VM of uid, once its guest is deleted.
func (f *Fleet) Unrecord(ctx context.Context, uid string) error {
	key, err := wire.BindingKey(uid)
	if err != nil {
		return err
	}
	return f.unrecord(ctx, key, func(b *records) { delete(b.held, uid) })
}

// UnrecordSize removes the size record of the Volume of uid, once its
// disk is deleted.
func (f *Fleet) UnrecordSize(ctx context.Context, uid string) error {
	key, err := wire.SizeKey(uid)
	if err != nil {
		return err
	}
	return f.unrecord(ctx, key, func(b *records) { delete(b.sizes, uid) })
}

// unrecord deletes the record under key, then forgets it.
func (f *Fleet) unrecord(ctx context.Context, key string, forget func(b *records)) error {
	if err := f.Bus.Delete(ctx, wire.BucketIntents, key); err != nil {
		return errors.Wrapf(err, "cannot remove the hub's record %s", key)
	}
	f.records.mu.Lock()
	forget(&f.records)
	f.records.mu.Unlock()
	return nil
}

// onSize takes e, the entry of the size record of the Volume of uid.
func (f *Fleet) onSize(e bus.Entry, uid string) error {
	b := &f.records
	if e.Deleted {
		b.mu.Lock()
		delete(b.sizes, uid)
		b.mu.Unlock()
		return nil
	}
	r, err := wire.DecodeVolumeSizeRecord(e.Value)
	if err != nil {
		return err
	}
	if r.UID != uid {
		return &wire.KeyError{What: "volume size record", Value: e.Key, Reason: "holds the size of uid " + r.UID}
	}
	f.keepSize(uid, r.SizeBytes)
	return nil
}

// keepSize remembers size as the Volume of uid's unless a larger one is
// remembered: a Volume only grows.
func (f *Fleet) keepSize(uid string, size int64) {
	b := &f.records
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.sizes[uid] >= size {
		return
	}
	if b.sizes == nil {
		b.sizes = map[string]int64{}
	}
	b.sizes[uid] = size
}

// SizeInEffect is the size the hub recorded for the Volume of uid
// (RecordSize), and whether it recorded one; ErrRecordsNotSynced until
// the records are read.
func (f *Fleet) SizeInEffect(uid string) (int64, bool, error) {
	b := &f.records
	b.mu.RLock()
	defer b.mu.RUnlock()
	if !b.synced {
		return 0, false, ErrRecordsNotSynced
	}
	size, ok := b.sizes[uid]
	return size, ok, nil
}

// RecordSize makes size the size in effect of the Volume of uid, unless a
// larger one is: the hub records a size once it admitted it against the
// namespace's quota, before it sends it to a node.
func (f *Fleet) RecordSize(ctx context.Context, uid string, size int64) error {
	if cur, ok, _ := f.SizeInEffect(uid); ok && cur >= size {
		return nil
	}
	key, err := wire.SizeKey(uid)
	if err != nil {
		return err
	}
	v, err := wire.EncodeVolumeSizeRecord(wire.VolumeSizeRecord{UID: uid, SizeBytes: size})
	if err != nil {
		return err
	}
	if _, err := f.Bus.Put(ctx, wire.BucketIntents, key, v); err != nil {
		return errors.Wrapf(err, "cannot record the size of Volume %s", uid)
	}
	f.keepSize(uid, size)
	return nil
}
