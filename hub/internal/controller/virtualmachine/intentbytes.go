package virtualmachine

import (
	"maps"
	"slices"
	"sync"

	"k8s.io/apimachinery/pkg/types"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/perobject"
)

// intentSize is what a VM's intents take of the intents bucket, and whose
// share they take it from.
type intentSize struct {
	namespace string
	bytes     int64
}

// intentBytes shares the intents bucket out among namespaces: one
// namespace's VMs with large intents (many disks and networks, long
// cloud-init user data) would otherwise fill the bucket, and every other
// namespace's publishes would fail. It counts what this hub published, so
// after a restart each VM counts again once its intent is published again.
//
// Each namespace's total is kept as the VMs' sizes change, so a publish
// costs the same however many VMs the hub holds. The memory's owner frees
// a VM that goes without a Delete of this hub (free, through OnForget);
// nothing records one after that, for only Update publishes, never for a
// VM that is gone.
type intentBytes struct {
	// mu makes a publish's check and its reservation one step, so two
	// VMs of a namespace published at once cannot both take its last
	// bytes.
	mu     sync.Mutex
	sizes  map[types.UID]intentSize
	totals map[string]int64
}

func newIntentBytes(memory *perobject.Owner) *intentBytes {
	b := &intentBytes{sizes: map[types.UID]intentSize{}, totals: map[string]int64{}}
	memory.OnForget(b.free)
	return b
}

// reserve counts intents, to be published for the VM of uid in namespace,
// against the namespace's share of limit bytes (none when limit is 0), in
// place of what the VM's intents took before. Until the publish is known
// to have landed (settle), the VM counts the larger of both.
func (b *intentBytes) reserve(uid types.UID, namespace string, intents map[string]wire.Intent, limit int64) (int64, error) {
	size, err := encodeIntents(intents, nil)
	if err != nil {
		return 0, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	before := b.sizes[uid]
	if before.namespace != namespace {
		before = intentSize{}
	}
	others := b.totals[namespace] - before.bytes
	if limit > 0 && size > before.bytes && others+size > limit {
		return 0, errors.Errorf("namespace %s holds %d bytes of intents and this VM's take %d more, past its share of %d bytes (--intent-bytes-per-namespace); it is published once the namespace's other VMs shrink or go",
			namespace, others+before.bytes, size-before.bytes, limit)
	}
	b.set(uid, intentSize{namespace: namespace, bytes: max(size, before.bytes)})
	return size, nil
}

// encodeIntents encodes each of intents as the bucket holds it
// (wire.GuestIntents.Encode), in the order of their nodes, hands it to each
// when each is set, and returns how many bytes they take in all.
func encodeIntents(intents map[string]wire.Intent, each func(node string, value []byte)) (int64, error) {
	var size int64
	for _, n := range slices.Sorted(maps.Keys(intents)) {
		v, err := wire.GuestIntents.Encode(intents[n])
		if err != nil {
			return 0, errors.Wrap(err, "cannot encode the intent")
		}
		size += int64(len(v))
		if each != nil {
			each(n, v)
		}
	}
	return size, nil
}

// settle counts size, the VM's intents just published, for the VM of uid.
func (b *intentBytes) settle(uid types.UID, namespace string, size int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.set(uid, intentSize{namespace: namespace, bytes: size})
}

// free stops counting the VM of uid, whose intents are deleted.
func (b *intentBytes) free(uid types.UID) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.set(uid, intentSize{})
}

// held is what the VMs of namespace take.
func (b *intentBytes) held(namespace string) int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.totals[namespace]
}

// set makes s what the VM of uid takes (nothing, when zero), and keeps the
// totals. b.mu must be held.
func (b *intentBytes) set(uid types.UID, s intentSize) {
	if old, ok := b.sizes[uid]; ok {
		if b.totals[old.namespace] -= old.bytes; b.totals[old.namespace] == 0 {
			delete(b.totals, old.namespace)
		}
		delete(b.sizes, uid)
	}
	if s == (intentSize{}) {
		return
	}
	b.sizes[uid] = s
	b.totals[s.namespace] += s.bytes
}
