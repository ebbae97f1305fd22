package ipam

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/harness/controlplane"
)

// TestOnARealAPIServer runs Allocators against a real kube-apiserver, whose
// refusal of a second record of one name is what keeps addresses unique
// across hub replicas.
func TestOnARealAPIServer(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a kube-apiserver; skipped with -short")
	}
	ctrl.SetLogger(logr.Discard())
	cp := controlplane.StartForTest(t)
	t.Run("TwoAllocatorsNeverShareAnAddress", func(t *testing.T) { testNeverShared(t, cp) })
	t.Run("TwoAllocatorsFillANetwork", func(t *testing.T) { testFill(t, cp) })
	t.Run("ReleaseSparesARecordMadeAgainForAnotherVM", func(t *testing.T) { testReleaseSpares(t, cp) })
}

// replica is an Allocator with a client of its own, as a hub replica has,
// and the count of its creates the API server refused.
type replica struct {
	*Allocator
	refused *atomic.Int64
}

// newReplica returns a replica that reads through informers of its own,
// indexed as the hub's are, or, with direct, from the API server (by label).
func newReplica(t *testing.T, cp *controlplane.ControlPlane, direct bool) replica {
	t.Helper()
	cfg := rest.CopyConfig(cp.Config)
	cfg.QPS = -1 // no client-side rate limit: the test is of the server
	c, err := client.New(cfg, client.Options{Scheme: cp.Scheme})
	require.NoError(t, err)
	counted := &refusals{Client: c}
	if direct {
		return replica{Allocator: New(counted, c), refused: &counted.n}
	}
	informers, ctx := cp.InformersForTest(t)
	require.NoError(t, Index(ctx, informers))
	return replica{Allocator: New(counted, informers), refused: &counted.n}
}

// refusals counts the creates the API server refuses.
type refusals struct {
	client.Client
	n atomic.Int64
}

func (c *refusals) Create(ctx context.Context, o client.Object, opts ...client.CreateOption) error {
	err := c.Client.Create(ctx, o, opts...)
	if err != nil {
		c.n.Add(1)
	}
	return err
}

// newNamespace creates a namespace for one test and returns its name.
func newNamespace(t *testing.T, cp *controlplane.ControlPlane, name string) string {
	t.Helper()
	require.NoError(t, cp.Client.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}))
	return name
}

// allocation is an address given to a VM, or the error Ensure returned.
type allocation struct {
	vm   *v1alpha1.VirtualMachine
	addr netip.Prefix
	err  error
}

// allocateConcurrently ensures an address for each of vms on network with
// eight goroutines per replica, all at once.
func allocateConcurrently(ctx context.Context, replicas []replica, network *v1alpha1.VirtualNetwork, vms []*v1alpha1.VirtualMachine) []allocation {
	work := make(chan int)
	got := make([]allocation, len(vms))
	var wg sync.WaitGroup
	for i := range 8 * len(replicas) {
		a := replicas[i%len(replicas)]
		wg.Go(func() {
			for j := range work {
				p, err := a.Ensure(ctx, vms[j], network, "")
				got[j] = allocation{vm: vms[j], addr: p, err: err}
			}
		})
	}
	for j := range vms {
		work <- j
	}
	close(work)
	wg.Wait()
	return got
}

func newVMs(namespace string, n int) []*v1alpha1.VirtualMachine {
	vms := make([]*v1alpha1.VirtualMachine, n)
	for i := range vms {
		vms[i] = &v1alpha1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: fmt.Sprintf("vm-%05d", i), UID: types.UID(uuid.NewString())}}
	}
	return vms
}

// assertRecords checks that the network's records are exactly the
// allocations that succeeded, each naming the VM it was given to.
func assertRecords(t *testing.T, cp *controlplane.ControlPlane, network *v1alpha1.VirtualNetwork, got []allocation) {
	t.Helper()
	byVM := map[string]allocation{}
	given := map[netip.Addr][]string{}
	for _, g := range got {
		if g.err == nil {
			byVM[g.vm.Name] = g
			given[g.addr.Addr()] = append(given[g.addr.Addr()], g.vm.Name)
		}
	}
	for addr, names := range given {
		assert.Len(t, names, 1, "address %s given to %v", addr, names)
	}
	l := &v1alpha1.NetworkAddressList{}
	require.NoError(t, cp.Client.List(context.Background(), l, client.InNamespace(network.Namespace), client.MatchingLabels{LabelNetwork: network.Name}))
	assert.Len(t, l.Items, len(byVM), "one record per VM given an address")
	for _, na := range l.Items {
		g, ok := byVM[string(na.Spec.VirtualMachine)]
		if !assert.True(t, ok, "record %s of VM %s, which was given no address", na.Name, na.Spec.VirtualMachine) {
			continue
		}
		assert.Equal(t, g.addr.Addr().String(), na.Spec.Address, "record %s", na.Name)
		assert.Equal(t, network.Name+"."+na.Spec.Address, na.Name)
		assert.Equal(t, string(g.vm.UID), na.Spec.VirtualMachineUID, "record %s", na.Name)
		assert.Equal(t, string(g.vm.UID), na.Labels[LabelVMUID], "record %s", na.Name)
		assert.Equal(t, network.Name, na.Labels[LabelNetwork], "record %s", na.Name)
		assert.Equal(t, network.Spec.ForProvider.CIDR, netip.PrefixFrom(g.addr.Addr(), g.addr.Bits()).Masked().String())
	}
}

// testNeverShared has two replicas, each with many goroutines, allocate
// ten thousand addresses of one network at once: no address is given
// twice, and every record names the VM it was given to.
func testNeverShared(t *testing.T, cp *controlplane.ControlPlane) {
	ctx := context.Background()
	ns := newNamespace(t, cp, "never-shared")
	replicas := []replica{newReplica(t, cp, false), newReplica(t, cp, false)}
	net := &v1alpha1.VirtualNetwork{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "net-big"}}
	net.Spec.ForProvider.CIDR = "10.64.0.0/18"
	require.NoError(t, cp.Client.Create(ctx, net))
	vms := newVMs(ns, 10000)

	start := time.Now()
	got := allocateConcurrently(ctx, replicas, net, vms)
	t.Logf("%d addresses allocated by two replicas in %s; the API server refused %d and %d creates",
		len(vms), time.Since(start).Round(time.Millisecond), replicas[0].refused.Load(), replicas[1].refused.Load())
	for _, g := range got {
		require.NoError(t, g.err, "VM %s", g.vm.Name)
	}
	assertRecords(t, cp, net, got)

	// Each replica answers for the other's VMs with the same address.
	for i := 0; i < len(got); i += 97 {
		for _, a := range replicas {
			p, err := a.Ensure(ctx, got[i].vm, net, "")
			require.NoError(t, err)
			assert.Equal(t, got[i].addr, p, "VM %s", got[i].vm.Name)
		}
	}
	for _, a := range replicas {
		require.Eventually(t, func() bool {
			allocated, total, err := a.Usage(ctx, net)
			return err == nil && allocated == len(vms) && total == 16381
		}, 10*time.Second, 100*time.Millisecond)
	}
}

// testFill has two replicas allocate more addresses than a network has at
// once, one of them reading from the API server without an index: each
// address is given once, and every VM without one was told the network is
// full.
func testFill(t *testing.T, cp *controlplane.ControlPlane) {
	ctx := context.Background()
	ns := newNamespace(t, cp, "fill")
	replicas := []replica{newReplica(t, cp, false), newReplica(t, cp, true)}
	net := &v1alpha1.VirtualNetwork{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "net-full"}}
	net.Spec.ForProvider.CIDR = "10.10.120.0/24"
	require.NoError(t, cp.Client.Create(ctx, net))

	got := allocateConcurrently(ctx, replicas, net, newVMs(ns, 300))
	t.Logf("the API server refused %d and %d creates", replicas[0].refused.Load(), replicas[1].refused.Load())
	ok := 0
	for _, g := range got {
		if g.err == nil {
			ok++
			continue
		}
		var exhausted *ExhaustedError
		if assert.True(t, errors.As(g.err, &exhausted), "VM %s: %v", g.vm.Name, g.err) {
			assert.Equal(t, ExhaustedError{Network: "net-full", Allocated: 253, Total: 253}, *exhausted)
		}
	}
	assert.Equal(t, 253, ok)
	assertRecords(t, cp, net, got)
	assert.True(t, replicas[1].unindexed.Load(), "the API server has no index by VM uid")
}

// testReleaseSpares checks that Release deletes only the record it knows, by
// uid: one made since under the same name is another VM's.
func testReleaseSpares(t *testing.T, cp *controlplane.ControlPlane) {
	ctx := context.Background()
	ns := newNamespace(t, cp, "release")
	a, b := New(cp.Client, cp.Client), New(cp.Client, cp.Client)
	net := &v1alpha1.VirtualNetwork{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "net-db", UID: "net-db-uid"}}
	net.Spec.ForProvider.CIDR = "10.10.120.0/24"
	web := &v1alpha1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web-1", UID: "web-1-uid"}}
	db := &v1alpha1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "db-1", UID: "db-1-uid"}}

	_, err := a.Ensure(ctx, web, net, "10.10.120.5")
	require.NoError(t, err)
	key := types.NamespacedName{Namespace: ns, Name: "net-db.10.10.120.5"}
	require.NoError(t, cp.Client.Delete(ctx, &v1alpha1.NetworkAddress{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}))
	_, err = b.Ensure(ctx, db, net, "10.10.120.5")
	require.NoError(t, err)

	require.NoError(t, a.Release(ctx, web))
	na := &v1alpha1.NetworkAddress{}
	require.NoError(t, cp.Client.Get(ctx, key, na))
	assert.Equal(t, "db-1", string(na.Spec.VirtualMachine))

	_, err = a.Ensure(ctx, web, net, "10.10.120.5")
	require.EqualError(t, err, "address 10.10.120.5 of network net-db is held by VirtualMachine db-1")
}
