package virtualnetwork

import (
	"context"
	"sync"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
)

// maxVNI is the largest VXLAN network identifier (24 bits).
const maxVNI = 1<<24 - 1

// vnis hands out VXLAN network identifiers, unique among the fleet's
// VirtualNetworks. A network keeps the one it was given in its status. The
// hub runs its controllers on one replica at a time (leader election), and
// that replica serializes its choices here; given remembers a choice until
// the network's status shows it, so that two networks reconciled one after
// the other before the cache caught up do not get the same one.
type vnis struct {
	mu    sync.Mutex
	given map[types.UID]int32
}

// vniAllocator is the hub's one VNI allocator, shared by every reconcile
// of the VirtualNetwork controller.
var vniAllocator = &vnis{given: map[types.UID]int32{}}

// of is n's VNI: the one its status holds, or the lowest one no other
// network holds or was given.
func (v *vnis) of(ctx context.Context, kube client.Reader, n *v1alpha1.VirtualNetwork) (int32, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if vni := n.Status.AtProvider.VNI; vni != 0 {
		delete(v.given, n.UID)
		return vni, nil
	}
	if vni, ok := v.given[n.UID]; ok {
		return vni, nil
	}
	all := &v1alpha1.VirtualNetworkList{}
	if err := kube.List(ctx, all); err != nil {
		return 0, errors.Wrap(err, "cannot list VirtualNetworks to choose a VNI")
	}
	used := make(map[int32]bool, len(all.Items)+len(v.given))
	for i := range all.Items {
		if all.Items[i].UID != n.UID {
			used[all.Items[i].Status.AtProvider.VNI] = true
		}
	}
	for _, vni := range v.given {
		used[vni] = true
	}
	for vni := int32(1); vni <= maxVNI; vni++ {
		if !used[vni] {
			v.given[n.UID] = vni
			return vni, nil
		}
	}
	return 0, errors.New("every VXLAN network identifier is taken: delete a VirtualNetwork")
}

// forget drops what was given to the network uid.
func (v *vnis) forget(uid types.UID) {
	v.mu.Lock()
	defer v.mu.Unlock()
	delete(v.given, uid)
}
