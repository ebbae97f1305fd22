package ipam

import (
	"cmp"
	"context"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
)

// view is what an Allocator knows of one network's records. Its mutex
// serialises the allocations on the network.
type view struct {
	mu sync.Mutex

	namespace, name string
	networkUID      types.UID
	subnet          subnet
	loaded          bool

	// records are the network's records by name; held those whose
	// address is in the usable range, by address; byVM those of each VM,
	// by VM uid and name.
	records map[string]*record
	held    map[uint32]*record
	byVM    map[string]map[string]*record
	// cursor is the next address next considers.
	cursor uint32
	// own are this Allocator's recent writes, by record name.
	own map[string]ownWrite
	// exhaustedAt is when a List last found every address held.
	exhaustedAt time.Time
}

// defaultExhaustedRecheck is Allocator.exhaustedRecheck: a release by
// another replica reaches the VMs waiting for an address within it.
const defaultExhaustedRecheck = 5 * time.Second

// ownWrite is a record this Allocator created (rec set) or deleted (rec
// nil), with the uid of the object written and when.
type ownWrite struct {
	rec *record
	uid types.UID
	at  time.Time
}

// ownWriteGrace is how long a record this Allocator created or deleted is
// believed over a reader that does not show the write yet. An informer shows
// a write far sooner; past it, the reader is believed, so that a record
// someone else deleted meanwhile is not kept in a view forever.
const ownWriteGrace = time.Minute

// record is what a view keeps of one NetworkAddress.
type record struct {
	name string
	ns   string
	// addr is the address the record's name holds; invalid when the name
	// is not "<network>.<a.b.c.d>".
	addr    netip.Addr
	vm      string
	vmUID   string
	uid     types.UID
	created time.Time
}

// fromObject is the record of o, a NetworkAddress of network.
func fromObject(o *v1alpha1.NetworkAddress, network string) *record {
	r := &record{
		name:    o.Name,
		ns:      o.Namespace,
		vm:      string(o.Spec.VirtualMachine),
		vmUID:   o.Spec.VirtualMachineUID,
		uid:     o.UID,
		created: o.CreationTimestamp.Time,
	}
	if s, ok := strings.CutPrefix(o.Name, network+"."); ok {
		if addr, err := netip.ParseAddr(s); err == nil && addr.Is4() {
			r.addr = addr
		}
	}
	return r
}

// recordName is the name of the record of addr on network.
func recordName(network string, addr netip.Addr) string {
	return network + "." + addr.String()
}

func (v *view) reset(uid types.UID, s subnet) {
	v.networkUID, v.subnet, v.loaded, v.exhaustedAt = uid, s, false, time.Time{}
	v.own = map[string]ownWrite{}
	v.clear()
}

func (v *view) clear() {
	v.records = map[string]*record{}
	v.held = map[uint32]*record{}
	v.byVM = map[string]map[string]*record{}
}

// add puts r in v, in place of any record of the same name.
func (v *view) add(r *record) {
	v.remove(r.name)
	v.records[r.name] = r
	if v.subnet.contains(r.addr) {
		v.held[index(r.addr)] = r
	}
	if r.vmUID != "" {
		if v.byVM[r.vmUID] == nil {
			v.byVM[r.vmUID] = map[string]*record{}
		}
		v.byVM[r.vmUID][r.name] = r
	}
}

func (v *view) remove(name string) {
	r := v.records[name]
	if r == nil {
		return
	}
	delete(v.records, name)
	if v.subnet.contains(r.addr) && v.held[index(r.addr)] == r {
		delete(v.held, index(r.addr))
	}
	if m := v.byVM[r.vmUID]; m != nil {
		delete(m, name)
		if len(m) == 0 {
			delete(v.byVM, r.vmUID)
		}
	}
}

// recordsOf returns the records of the VM uid, oldest first, so that of
// several the one every replica keeps is the same.
func (v *view) recordsOf(uid string) []*record {
	recs := make([]*record, 0, len(v.byVM[uid]))
	for _, r := range v.byVM[uid] {
		recs = append(recs, r)
	}
	slices.SortFunc(recs, func(x, y *record) int {
		return cmp.Or(x.created.Compare(y.created), cmp.Compare(x.name, y.name))
	})
	return recs
}

// next returns the first free address from the cursor and moves the cursor
// past it; false when v holds every address.
func (v *view) next() (netip.Addr, bool) {
	total := v.subnet.total()
	if len(v.held) >= total {
		return netip.Addr{}, false
	}
	for range total {
		u := v.cursor
		v.cursor = v.after(u)
		if _, taken := v.held[u]; !taken {
			return address(u), true
		}
	}
	return netip.Addr{}, false
}

// jump moves the cursor to a random address of the range.
func (v *view) jump() {
	v.cursor = v.subnet.lo + rand.Uint32N(uint32(v.subnet.total()))
}

// after is the address next considers after u.
func (v *view) after(u uint32) uint32 {
	if u >= v.subnet.hi {
		return v.subnet.lo
	}
	return u + 1
}

// view returns the view of network, new and unloaded when there is none.
func (a *Allocator) view(network *v1alpha1.VirtualNetwork) *view {
	a.mu.Lock()
	defer a.mu.Unlock()
	k := types.NamespacedName{Namespace: network.Namespace, Name: network.Name}
	v := a.views[k]
	if v == nil {
		v = &view{namespace: network.Namespace, name: network.Name}
		a.views[k] = v
	}
	return v
}

// load makes v a loaded view of network: it starts again from a List when
// v was never loaded or was of another network of that name (another uid)
// or of another cidr. The caller holds v.mu.
func (a *Allocator) load(ctx context.Context, v *view, network *v1alpha1.VirtualNetwork, s subnet) error {
	if v.loaded && v.networkUID == network.UID && v.subnet == s {
		return nil
	}
	v.reset(network.UID, s)
	if err := a.refresh(ctx, v); err != nil {
		return err
	}
	v.loaded = true
	v.cursor = s.lo
	if len(v.held) > 0 {
		v.cursor = v.after(slices.Max(slices.Collect(maps.Keys(v.held))))
	}
	return nil
}

// refresh rebuilds v from a List of its network's records, keeping this
// Allocator's own recent writes that the reader does not show yet. The
// caller holds v.mu.
func (a *Allocator) refresh(ctx context.Context, v *view) error {
	list := &v1alpha1.NetworkAddressList{}
	if err := a.r.List(ctx, list, client.InNamespace(v.namespace), client.MatchingLabels{LabelNetwork: v.name}); err != nil {
		return errors.Wrapf(err, "cannot list the addresses of network %s", v.name)
	}
	now := time.Now()
	for name, w := range v.own {
		if now.Sub(w.at) > ownWriteGrace {
			delete(v.own, name)
		}
	}
	v.clear()
	for i := range list.Items {
		r := fromObject(&list.Items[i], v.name)
		if w, ok := v.own[r.name]; ok {
			switch {
			case w.rec == nil && w.uid == r.uid:
				// This Allocator deleted it; the reader lags.
				continue
			case w.rec == nil:
				// Made again since, by someone else.
				delete(v.own, r.name)
			case w.uid != r.uid:
				// The reader lags behind this Allocator's create
				// and shows a record of that name before it.
				continue
			default:
				// The reader shows this Allocator's create.
				delete(v.own, r.name)
			}
		}
		v.add(r)
	}
	for _, w := range v.own {
		if w.rec != nil {
			v.add(w.rec)
		}
	}
	return nil
}

// lookup adds the records of vm that the reader has to v and returns those
// v knows. The caller holds v.mu.
func (a *Allocator) lookup(ctx context.Context, v *view, vm *v1alpha1.VirtualMachine) ([]*record, error) {
	list, err := a.listOf(ctx, vm)
	if err != nil {
		return nil, err
	}
	for i := range list.Items {
		if string(list.Items[i].Spec.Network) != v.name {
			continue
		}
		r := fromObject(&list.Items[i], v.name)
		if w, ok := v.own[r.name]; ok && w.rec == nil && w.uid == r.uid {
			continue // deleted by this Allocator; the reader lags
		}
		v.add(r)
	}
	return v.recordsOf(string(vm.UID)), nil
}

// listOf lists the records of vm in its namespace: by IndexVMUID while the
// reader has that index, else by label.
func (a *Allocator) listOf(ctx context.Context, vm *v1alpha1.VirtualMachine) (*v1alpha1.NetworkAddressList, error) {
	list := &v1alpha1.NetworkAddressList{}
	if !a.unindexed.Load() {
		err := a.r.List(ctx, list, client.InNamespace(vm.Namespace), client.MatchingFields{IndexVMUID: string(vm.UID)})
		if err == nil || ctx.Err() != nil {
			return list, errors.Wrapf(err, "cannot list the addresses of VirtualMachine %s/%s", vm.Namespace, vm.Name)
		}
		a.unindexed.Store(true)
	}
	err := a.r.List(ctx, list, client.InNamespace(vm.Namespace), client.MatchingLabels{LabelVMUID: string(vm.UID)})
	return list, errors.Wrapf(err, "cannot list the addresses of VirtualMachine %s/%s", vm.Namespace, vm.Name)
}
