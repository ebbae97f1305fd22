package ipam

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/apis"
	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
)

const ns = "team-a"

func newVM(name string) *v1alpha1.VirtualMachine {
	return &v1alpha1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(name + "-uid")}}
}

func newNet(name, cidr string) *v1alpha1.VirtualNetwork {
	n := &v1alpha1.VirtualNetwork{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(name + "-uid")}}
	n.Spec.ForProvider.CIDR = cidr
	return n
}

func newClient(t *testing.T) client.Client {
	t.Helper()
	s := k8sruntime.NewScheme()
	require.NoError(t, apis.AddToScheme(s))
	return fake.NewClientBuilder().WithScheme(s).Build()
}

// newIndexedClient is newClient with IndexVMUID, as the hub's informers.
func newIndexedClient(t *testing.T) client.Client {
	t.Helper()
	s := k8sruntime.NewScheme()
	require.NoError(t, apis.AddToScheme(s))
	return fake.NewClientBuilder().WithScheme(s).WithIndex(&v1alpha1.NetworkAddress{}, IndexVMUID, vmUIDOf).Build()
}

// records returns the addresses recorded in the API, by record name, as
// "<vm>=<address>".
func records(t *testing.T, c client.Client, opts ...client.ListOption) map[string]string {
	t.Helper()
	l := &v1alpha1.NetworkAddressList{}
	require.NoError(t, c.List(context.Background(), l, append(opts, client.InNamespace(ns))...))
	got := map[string]string{}
	for _, na := range l.Items {
		got[na.Name] = fmt.Sprintf("%s=%s", na.Spec.VirtualMachine, na.Spec.Address)
	}
	return got
}

func TestEnsureGivesAddressesInOrderUntilTheNetworkIsFull(t *testing.T) {
	ctx := context.Background()
	c := newClient(t)
	a := New(c, c)
	net := newNet("net-db", "10.0.0.0/29")

	for i, want := range []string{"10.0.0.2/29", "10.0.0.3/29", "10.0.0.4/29", "10.0.0.5/29", "10.0.0.6/29"} {
		got, err := a.Ensure(ctx, newVM(fmt.Sprintf("vm-%d", i)), net, "")
		require.NoError(t, err)
		assert.Equal(t, want, got.String())
	}
	_, err := a.Ensure(ctx, newVM("vm-5"), net, "")
	var exhausted *ExhaustedError
	require.ErrorAs(t, err, &exhausted)
	assert.EqualError(t, err, "network net-db has no free address (5 of 5 allocated)")
	assert.False(t, IsTerminal(err), "an address frees up when a VM goes")

	allocated, total, err := a.Usage(ctx, net)
	require.NoError(t, err)
	assert.Equal(t, [2]int{5, 5}, [2]int{allocated, total})
}

func TestEnsureIsIdempotent(t *testing.T) {
	ctx := context.Background()
	c := newClient(t)
	net := newNet("net-db", "10.10.120.0/24")
	vm := newVM("web-1")

	first, err := New(c, c).Ensure(ctx, vm, net, "")
	require.NoError(t, err)
	assert.Equal(t, "10.10.120.2/24", first.String())

	a := New(c, c)
	for range 3 {
		got, err := a.Ensure(ctx, vm, net, "")
		require.NoError(t, err)
		assert.Equal(t, first, got, "the VM keeps its address, also through a restarted hub")
	}
	assert.Equal(t, map[string]string{"net-db.10.10.120.2": "web-1=10.10.120.2"}, records(t, c))

	na := &v1alpha1.NetworkAddress{}
	require.NoError(t, c.Get(ctx, types.NamespacedName{Namespace: ns, Name: "net-db.10.10.120.2"}, na))
	assert.Equal(t, map[string]string{LabelNetwork: "net-db", LabelVMUID: "web-1-uid"}, na.Labels)
	assert.Equal(t, v1alpha1.NetworkAddressSpec{Network: "net-db", Address: "10.10.120.2", VirtualMachine: "web-1", VirtualMachineUID: "web-1-uid"}, na.Spec)
	assert.Equal(t, []metav1.OwnerReference{{
		APIVersion: "compute.virtfleet.io/v1alpha1", Kind: "VirtualMachine", Name: "web-1", UID: "web-1-uid",
		Controller: ptr.To(false), BlockOwnerDeletion: ptr.To(false),
	}}, na.OwnerReferences)

	// A VM re-created under the same name is another VM.
	again := newVM("web-1")
	again.UID = "web-1-uid-2"
	got, err := a.Ensure(ctx, again, net, "")
	require.NoError(t, err)
	assert.Equal(t, "10.10.120.3/24", got.String())
}

func TestEnsureFixedAddress(t *testing.T) {
	type held struct{ vm, fixed string }
	cases := []struct {
		name string
		// before are the VMs holding addresses before (fixed empty: any).
		before []held
		vm     string
		fixed  string
		want   string
		// wantErr, when set, is the error's message; a terminal one is
		// an InvalidAddressError, another a HeldError.
		wantErr  string
		terminal bool
		// wantRecords are the records afterwards, by name.
		wantRecords map[string]string
	}{
		{
			name: "FreeInRange", vm: "db-1", fixed: "10.10.120.5", want: "10.10.120.5/24",
			wantRecords: map[string]string{"net-db.10.10.120.5": "db-1=10.10.120.5"},
		},
		{
			name: "LastInRange", vm: "db-1", fixed: "10.10.120.254", want: "10.10.120.254/24",
			wantRecords: map[string]string{"net-db.10.10.120.254": "db-1=10.10.120.254"},
		},
		{
			name: "OutsideTheCIDR", vm: "db-1", fixed: "10.10.121.5", terminal: true,
			wantErr:     "spec.forProvider.addresses: 10.10.121.5 is not an address VirtualNetwork net-db gives VMs: it is outside the network's cidr 10.10.120.0/24, which gives VMs 10.10.120.2 to 10.10.120.254",
			wantRecords: map[string]string{},
		},
		{
			name: "TheNetworkAddress", vm: "db-1", fixed: "10.10.120.0", terminal: true,
			wantErr:     "spec.forProvider.addresses: 10.10.120.0 is not an address VirtualNetwork net-db gives VMs: it is the network address of cidr 10.10.120.0/24, which gives VMs 10.10.120.2 to 10.10.120.254",
			wantRecords: map[string]string{},
		},
		{
			name: "TheGateway", vm: "db-1", fixed: "10.10.120.1", terminal: true,
			wantErr:     "spec.forProvider.addresses: 10.10.120.1 is not an address VirtualNetwork net-db gives VMs: it is the gateway, the host's own address, of cidr 10.10.120.0/24, which gives VMs 10.10.120.2 to 10.10.120.254",
			wantRecords: map[string]string{},
		},
		{
			name: "TheBroadcastAddress", vm: "db-1", fixed: "10.10.120.255", terminal: true,
			wantErr:     "spec.forProvider.addresses: 10.10.120.255 is not an address VirtualNetwork net-db gives VMs: it is the broadcast address of cidr 10.10.120.0/24, which gives VMs 10.10.120.2 to 10.10.120.254",
			wantRecords: map[string]string{},
		},
		{
			name: "NotIPv4", vm: "db-1", fixed: "fd00::5", terminal: true,
			wantErr:     "spec.forProvider.addresses: fd00::5 is not an address VirtualNetwork net-db gives VMs: it is not an IPv4 address; the network's cidr is 10.10.120.0/24, which gives VMs 10.10.120.2 to 10.10.120.254",
			wantRecords: map[string]string{},
		},
		{
			name:   "HeldByAnotherVM",
			before: []held{{vm: "web-1", fixed: "10.10.120.5"}}, vm: "db-1", fixed: "10.10.120.5",
			wantErr:     "address 10.10.120.5 of network net-db is held by VirtualMachine web-1",
			wantRecords: map[string]string{"net-db.10.10.120.5": "web-1=10.10.120.5"},
		},
		{
			name:   "ReAskedByItsHolder",
			before: []held{{vm: "db-1", fixed: "10.10.120.5"}}, vm: "db-1", fixed: "10.10.120.5", want: "10.10.120.5/24",
			wantRecords: map[string]string{"net-db.10.10.120.5": "db-1=10.10.120.5"},
		},
		{
			name:   "ReplacesTheAddressTheVMHad",
			before: []held{{vm: "db-1"}}, vm: "db-1", fixed: "10.10.120.9", want: "10.10.120.9/24",
			wantRecords: map[string]string{"net-db.10.10.120.9": "db-1=10.10.120.9"},
		},
		{
			name:   "RefusedKeepsTheAddressTheVMHad",
			before: []held{{vm: "db-1"}, {vm: "web-1", fixed: "10.10.120.9"}}, vm: "db-1", fixed: "10.10.120.9",
			wantErr:     "address 10.10.120.9 of network net-db is held by VirtualMachine web-1",
			wantRecords: map[string]string{"net-db.10.10.120.2": "db-1=10.10.120.2", "net-db.10.10.120.9": "web-1=10.10.120.9"},
		},
		{
			name:   "KeptWhenNoLongerFixed",
			before: []held{{vm: "db-1", fixed: "10.10.120.7"}}, vm: "db-1", want: "10.10.120.7/24",
			wantRecords: map[string]string{"net-db.10.10.120.7": "db-1=10.10.120.7"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			c := newClient(t)
			a := New(c, c)
			net := newNet("net-db", "10.10.120.0/24")
			for _, h := range tc.before {
				_, err := a.Ensure(ctx, newVM(h.vm), net, h.fixed)
				require.NoError(t, err)
			}
			got, err := a.Ensure(ctx, newVM(tc.vm), net, tc.fixed)
			if tc.wantErr != "" {
				require.EqualError(t, err, tc.wantErr)
				assert.Equal(t, tc.terminal, IsTerminal(err))
				if tc.terminal {
					var invalid *InvalidAddressError
					require.ErrorAs(t, err, &invalid)
					assert.Equal(t, "10.10.120.0/24", invalid.CIDR)
				} else {
					var heldErr *HeldError
					require.ErrorAs(t, err, &heldErr)
				}
			} else {
				require.NoError(t, err)
				assert.Equal(t, tc.want, got.String())
			}
			assert.Equal(t, tc.wantRecords, records(t, c))
		})
	}
}

func TestEnsureRefusesANetworkWithoutAddresses(t *testing.T) {
	for name, cidr := range map[string]string{
		"NoCIDR":  "",
		"Slash31": "10.0.0.0/31",
		"IPv6":    "fd00::/64",
	} {
		t.Run(name, func(t *testing.T) {
			c := newClient(t)
			_, err := New(c, c).Ensure(context.Background(), newVM("web-1"), newNet("net-db", cidr), "")
			var invalid *InvalidNetworkError
			require.ErrorAs(t, err, &invalid)
			assert.True(t, IsTerminal(err))
			assert.Contains(t, err.Error(), "VirtualNetwork net-db: spec.forProvider.cidr")
		})
	}
	c := newClient(t)
	got, err := New(c, c).Ensure(context.Background(), newVM("web-1"), newNet("net-db", "10.0.0.0/30"), "")
	require.NoError(t, err)
	assert.Equal(t, "10.0.0.2/30", got.String(), "a /30 has one address for a VM")
}

func TestReleaseThenAllocateAgain(t *testing.T) {
	ctx := context.Background()
	c := newClient(t)
	a := New(c, c)
	db := newNet("net-db", "10.0.0.0/29")
	web := newNet("net-web", "10.0.1.0/24")

	vms := make([]*v1alpha1.VirtualMachine, 5)
	for i := range vms {
		vms[i] = newVM(fmt.Sprintf("vm-%d", i))
		_, err := a.Ensure(ctx, vms[i], db, "")
		require.NoError(t, err)
	}
	_, err := a.Ensure(ctx, vms[2], web, "")
	require.NoError(t, err)

	require.NoError(t, a.Release(ctx, vms[2]))
	assert.Empty(t, records(t, c, client.MatchingLabels{LabelVMUID: "vm-2-uid"}), "every record of the VM is gone, on every network")
	require.NoError(t, a.Release(ctx, vms[2]), "releasing again is no error")
	allocated, total, err := a.Usage(ctx, db)
	require.NoError(t, err)
	assert.Equal(t, [2]int{4, 5}, [2]int{allocated, total})

	got, err := a.Ensure(ctx, newVM("vm-5"), db, "")
	require.NoError(t, err)
	assert.Equal(t, "10.0.0.4/29", got.String(), "the released address is the only free one")

	// Next-fit: an address released is not the next one given while
	// others are free.
	require.NoError(t, a.Release(ctx, vms[0]))
	require.NoError(t, a.Release(ctx, vms[1]))
	got, err = a.Ensure(ctx, newVM("vm-6"), db, "")
	require.NoError(t, err)
	assert.Equal(t, "10.0.0.2/29", got.String(), "the cursor wrapped around")
	got, err = a.Ensure(ctx, newVM("vm-7"), web, "")
	require.NoError(t, err)
	assert.Equal(t, "10.0.1.3/24", got.String(), "10.0.1.2 was released last")
}

// TestTwoAllocators runs two Allocators on one API server, as two hub
// replicas are: each learns what the other did from the API server alone.
func TestTwoAllocators(t *testing.T) {
	t.Run("ByLabel", func(t *testing.T) { testTwoAllocators(t, newClient(t), false) })
	t.Run("ByIndex", func(t *testing.T) { testTwoAllocators(t, newIndexedClient(t), true) })
}

func testTwoAllocators(t *testing.T, c client.Client, indexed bool) {
	ctx := context.Background()
	net := newNet("net-db", "10.0.0.0/29")
	a, b := New(c, c), New(c, c)
	// b lists the network again on every allocation it finds it full on,
	// so it learns a's releases at once (see
	// TestAFullNetworkIsListedOncePerRecheck for the default).
	b.exhaustedRecheck = 0
	_, _, err := b.Usage(ctx, net) // b's view is loaded while the network is empty
	require.NoError(t, err)

	got, err := a.Ensure(ctx, newVM("vm-1"), net, "")
	require.NoError(t, err)
	assert.Equal(t, "10.0.0.2/29", got.String())
	got, err = b.Ensure(ctx, newVM("vm-1"), net, "")
	require.NoError(t, err)
	assert.Equal(t, "10.0.0.2/29", got.String(), "the record of the same VM is its allocation")

	// b's view does not know 10.0.0.2 is vm-1's (b learnt it, a has
	// not learnt what b takes): each allocation is still unique.
	given := map[string]string{"vm-1": "10.0.0.2"}
	for i, vm := range []string{"vm-2", "vm-3", "vm-4", "vm-5"} {
		p, err := []*Allocator{b, a}[i%2].Ensure(ctx, newVM(vm), net, "")
		require.NoError(t, err)
		given[vm] = p.Addr().String()
	}
	assert.ElementsMatch(t, []string{"10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5", "10.0.0.6"}, slices.Collect(maps.Values(given)))
	_, err = b.Ensure(ctx, newVM("vm-6"), net, "")
	require.EqualError(t, err, "network net-db has no free address (5 of 5 allocated)")

	// b learns a release by a from the API server.
	require.NoError(t, a.Release(ctx, newVM("vm-3")))
	got, err = b.Ensure(ctx, newVM("vm-6"), net, "")
	require.NoError(t, err)
	assert.Equal(t, given["vm-3"], got.Addr().String())

	// And so does a fixed address held, in b's view, by a released VM.
	require.NoError(t, a.Release(ctx, newVM("vm-2")))
	got, err = b.Ensure(ctx, newVM("vm-7"), net, given["vm-2"])
	require.NoError(t, err)
	assert.Equal(t, given["vm-2"], got.Addr().String())

	// A VM b's view never came across keeps the address a gave it.
	web := newNet("net-web", "10.0.1.0/24")
	_, _, err = b.Usage(ctx, web)
	require.NoError(t, err)
	for _, vm := range []string{"vm-8", "vm-9"} {
		_, err := a.Ensure(ctx, newVM(vm), web, "")
		require.NoError(t, err)
	}
	got, err = b.Ensure(ctx, newVM("vm-9"), web, "")
	require.NoError(t, err)
	assert.Equal(t, "10.0.1.3/24", got.String())
	assert.Len(t, records(t, c, client.MatchingLabels{LabelVMUID: "vm-9-uid"}), 1)
	assert.Equal(t, !indexed, b.unindexed.Load(), "b looked VMs up by index when it could")
}

// TestAFullNetworkIsListedOncePerRecheck: the VMs waiting for an address of
// a full network do not each list all its records (a List as long as the
// network: at 65,000 addresses, half the hub's CPU); the network is listed
// again once exhaustedRecheck has passed, and a release by this Allocator
// is seen at once.
func TestAFullNetworkIsListedOncePerRecheck(t *testing.T) {
	ctx := context.Background()
	s := k8sruntime.NewScheme()
	require.NoError(t, apis.AddToScheme(s))
	var networkLists atomic.Int32
	c := fake.NewClientBuilder().WithScheme(s).WithInterceptorFuncs(interceptor.Funcs{
		List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			lo := (&client.ListOptions{}).ApplyOptions(opts)
			if lo.LabelSelector != nil && strings.Contains(lo.LabelSelector.String(), LabelNetwork) {
				networkLists.Add(1)
			}
			return c.List(ctx, list, opts...)
		},
	}).Build()
	a := New(c, c)
	a.exhaustedRecheck = time.Hour
	net := newNet("net-db", "10.0.0.0/30") // one address for VMs

	_, err := a.Ensure(ctx, newVM("vm-0"), net, "")
	require.NoError(t, err)
	before := networkLists.Load()
	for i := range 10 {
		_, err := a.Ensure(ctx, newVM(fmt.Sprintf("vm-%d", i+1)), net, "")
		var exhausted *ExhaustedError
		require.ErrorAs(t, err, &exhausted)
	}
	assert.Equal(t, int32(1), networkLists.Load()-before, "ten VMs told the network is full with one List")

	require.NoError(t, a.Release(ctx, newVM("vm-0")))
	got, err := a.Ensure(ctx, newVM("vm-1"), net, "")
	require.NoError(t, err, "this Allocator's own release frees the address at once")
	assert.Equal(t, "10.0.0.2/30", got.String())

	a.exhaustedRecheck = 0
	before = networkLists.Load()
	_, err = a.Ensure(ctx, newVM("vm-2"), net, "")
	require.Error(t, err)
	assert.Equal(t, int32(1), networkLists.Load()-before, "past the recheck, the network is listed again")
}

func TestEnsureRecordsAgainWhatWasDeletedByHand(t *testing.T) {
	ctx := context.Background()
	c := newClient(t)
	a := New(c, c)
	net := newNet("net-db", "10.10.120.0/24")
	vm := newVM("web-1")
	_, err := a.Ensure(ctx, vm, net, "")
	require.NoError(t, err)
	require.NoError(t, c.Delete(ctx, &v1alpha1.NetworkAddress{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "net-db.10.10.120.2"}}))

	got, err := a.Ensure(ctx, vm, net, "")
	require.NoError(t, err)
	assert.Equal(t, "10.10.120.2/24", got.String())
	assert.Equal(t, map[string]string{"net-db.10.10.120.2": "web-1=10.10.120.2"}, records(t, c))
}

func TestEnsureMovesTheVMWhenTheCIDRChanges(t *testing.T) {
	ctx := context.Background()
	c := newClient(t)
	a := New(c, c)
	vm := newVM("web-1")
	_, err := a.Ensure(ctx, vm, newNet("net-db", "10.10.120.0/24"), "")
	require.NoError(t, err)

	got, err := a.Ensure(ctx, vm, newNet("net-db", "10.10.130.0/24"), "")
	require.NoError(t, err)
	assert.Equal(t, "10.10.130.2/24", got.String())
	assert.Equal(t, map[string]string{"net-db.10.10.130.2": "web-1=10.10.130.2"}, records(t, c))
}

func TestEnsureKeepsTheOldestOfDuplicates(t *testing.T) {
	ctx := context.Background()
	c := newClient(t)
	net := newNet("net-db", "10.10.120.0/24")
	vm := newVM("web-1")
	// Two replicas racing for one VM can each record an address.
	for i, addr := range []string{"10.10.120.9", "10.10.120.3"} {
		require.NoError(t, c.Create(ctx, &v1alpha1.NetworkAddress{
			ObjectMeta: metav1.ObjectMeta{
				Namespace: ns, Name: "net-db." + addr,
				Labels:            map[string]string{LabelNetwork: "net-db", LabelVMUID: "web-1-uid"},
				CreationTimestamp: metav1.Unix(int64(1000+i), 0),
			},
			Spec: v1alpha1.NetworkAddressSpec{Network: "net-db", Address: addr, VirtualMachine: "web-1", VirtualMachineUID: "web-1-uid"},
		}))
	}

	got, err := New(c, c).Ensure(ctx, vm, net, "")
	require.NoError(t, err)
	assert.Equal(t, "10.10.120.9/24", got.String())
	assert.Equal(t, map[string]string{"net-db.10.10.120.9": "web-1=10.10.120.9"}, records(t, c))
}

func TestEnsureIsSafeForConcurrentUse(t *testing.T) {
	ctx := context.Background()
	c := newClient(t)
	a := New(c, c)
	net := newNet("net-db", "10.10.120.0/24")
	ensureDistinct(t, a, net, 253)
	_, err := a.Ensure(ctx, newVM("one-more"), net, "")
	assert.True(t, errors.As(err, new(*ExhaustedError)), "%v", err)
}

// TestAllocationsOnOneNetworkDoNotWaitForEachOthersWrites pins that the
// network's lock is not held while the API server records an address: the
// client holds every Create until four are in flight at once, which only
// happens if four allocations on one network write in parallel; each still
// gets an address of its own.
func TestAllocationsOnOneNetworkDoNotWaitForEachOthersWrites(t *testing.T) {
	const vms = 4
	s := k8sruntime.NewScheme()
	require.NoError(t, v1alpha1.SchemeBuilder.AddToScheme(s))
	var (
		mu       sync.Mutex
		inFlight int
		all      = make(chan struct{})
	)
	c := fake.NewClientBuilder().WithScheme(s).WithInterceptorFuncs(interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, o client.Object, opts ...client.CreateOption) error {
			mu.Lock()
			if inFlight++; inFlight == vms {
				close(all)
			}
			mu.Unlock()
			select {
			case <-all:
			case <-time.After(10 * time.Second):
				return errors.New("the other allocations never wrote while this one did")
			}
			return c.Create(ctx, o, opts...)
		},
	}).Build()
	ensureDistinct(t, New(c, c), newNet("net-db", "10.10.120.0/24"), vms)
	assert.Len(t, records(t, c), vms)
}

// ensureDistinct has a give addresses of net to n VMs at once and checks
// that each got one of its own.
func ensureDistinct(t *testing.T, a *Allocator, net *v1alpha1.VirtualNetwork, n int) {
	t.Helper()
	got := make([]netip.Prefix, n)
	var wg sync.WaitGroup
	for i := range got {
		wg.Go(func() {
			p, err := a.Ensure(context.Background(), newVM(fmt.Sprintf("vm-%d", i)), net, "")
			assert.NoError(t, err)
			got[i] = p
		})
	}
	wg.Wait()
	seen := map[netip.Prefix]bool{}
	for _, p := range got {
		assert.False(t, seen[p], "%s given twice", p)
		seen[p] = true
	}
	assert.Len(t, seen, n)
}

func TestEnsureRefusesAVMWithoutUID(t *testing.T) {
	c := newClient(t)
	vm := newVM("web-1")
	vm.UID = ""
	_, err := New(c, c).Ensure(context.Background(), vm, newNet("net-db", "10.0.0.0/24"), "")
	require.Error(t, err)
}

func TestKnownAnswersWithoutWriting(t *testing.T) {
	ctx := context.Background()
	c := newClient(t)
	net := newNet("net-db", "10.10.120.0/24")
	vm := newVM("web-1")
	a := New(c, c)

	_, ok := a.Known(vm, net, "")
	assert.False(t, ok, "nothing loaded yet")
	got, err := a.Ensure(ctx, vm, net, "")
	require.NoError(t, err)

	cases := []struct {
		name  string
		vm    *v1alpha1.VirtualMachine
		net   *v1alpha1.VirtualNetwork
		fixed string
		want  string
	}{
		{"TheAddressEnsureGave", vm, net, "", got.String()},
		{"TheFixedAddressItHolds", vm, net, got.Addr().String(), got.String()},
		{"NotAnotherFixedAddress", vm, net, "10.10.120.77", ""},
		{"NotAnotherVM", newVM("web-2"), net, "", ""},
		{"NotANetworkWhoseCIDRChanged", vm, newNet("net-db", "10.10.121.0/24"), "", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := records(t, c)
			p, ok := a.Known(tc.vm, tc.net, tc.fixed)
			assert.Equal(t, tc.want != "", ok)
			if ok {
				assert.Equal(t, tc.want, p.String())
			}
			assert.Equal(t, before, records(t, c), "nothing written")
		})
	}
}

// TestKeepAndAdopt: a released guest's addresses stay held, without an
// owner for the garbage collector, and go to the VM that adopts it.
func TestKeepAndAdopt(t *testing.T) {
	ctx := context.Background()
	c := newIndexedClient(t)
	net := newNet("net-db", "10.10.120.0/24")
	old := newVM("web-1")
	a := New(c, c)
	got, err := a.Ensure(ctx, old, net, "")
	require.NoError(t, err)

	require.NoError(t, a.Keep(ctx, old))
	na := &v1alpha1.NetworkAddress{}
	require.NoError(t, c.Get(ctx, types.NamespacedName{Namespace: ns, Name: "net-db." + got.Addr().String()}, na))
	assert.Empty(t, na.OwnerReferences, "nothing for the garbage collector to follow")
	assert.Equal(t, "web-1-uid", na.Spec.VirtualMachineUID, "still held")

	next := newVM("web-1")
	next.UID = "web-1-uid-2"
	handed, err := a.Adopt(ctx, next, string(old.UID))
	require.NoError(t, err)
	assert.Equal(t, map[string]netip.Addr{"net-db": got.Addr()}, handed)
	assert.Equal(t, map[string]string{"net-db." + got.Addr().String(): "web-1=" + got.Addr().String()}, records(t, c))
	require.NoError(t, c.Get(ctx, types.NamespacedName{Namespace: ns, Name: "net-db." + got.Addr().String()}, na))
	assert.Equal(t, "web-1-uid-2", na.Spec.VirtualMachineUID)
	assert.Equal(t, "web-1-uid-2", na.Labels[LabelVMUID])
	require.Len(t, na.OwnerReferences, 1)
	assert.Equal(t, next.UID, na.OwnerReferences[0].UID)

	p, ok := a.Known(next, net, "")
	assert.True(t, ok)
	assert.Equal(t, got, p, "the adopter holds the address in the allocator's view too")
	again, err := a.Ensure(ctx, next, net, "")
	require.NoError(t, err)
	assert.Equal(t, got, again, "and keeps it")
	handed, err = a.Adopt(ctx, next, string(old.UID))
	require.NoError(t, err)
	assert.Empty(t, handed, "nothing left to hand over")
}

// TestReleaseWithoutTheDeleteVerb: a hub that may not delete (installed by
// Crossplane's package manager) leaves the records to the garbage
// collector, and never gives their addresses again meanwhile.
func TestReleaseWithoutTheDeleteVerb(t *testing.T) {
	ctx := context.Background()
	s := k8sruntime.NewScheme()
	require.NoError(t, apis.AddToScheme(s))
	c := fake.NewClientBuilder().WithScheme(s).WithInterceptorFuncs(interceptor.Funcs{
		Delete: func(context.Context, client.WithWatch, client.Object, ...client.DeleteOption) error {
			return kerrors.NewForbidden(v1alpha1.SchemeGroupVersion.WithResource("networkaddresses").GroupResource(), "x", errors.New("no delete"))
		},
	}).Build()
	a := New(c, c)
	net := newNet("net-db", "10.0.0.0/24")
	gone := newVM("gone")
	first, err := a.Ensure(ctx, gone, net, "")
	require.NoError(t, err)

	require.NoError(t, a.Release(ctx, gone), "not an error: the garbage collector frees them")
	assert.Equal(t, map[string]string{"net-db." + first.Addr().String(): "gone=" + first.Addr().String()}, records(t, c))
	next, err := a.Ensure(ctx, newVM("next"), net, "")
	require.NoError(t, err)
	assert.NotEqual(t, first, next, "still held")
}

// TestForgetDropsTheNetworksView: once a network is gone the allocator keeps
// nothing of it, and Known answers only after Ensure loads it again.
func TestForgetDropsTheNetworksView(t *testing.T) {
	ctx := context.Background()
	c := newClient(t)
	a := New(c, c)
	net, other := newNet("net-db", "10.10.120.0/24"), newNet("net-web", "10.10.121.0/24")
	vm := newVM("web-1")
	got, err := a.Ensure(ctx, vm, net, "")
	require.NoError(t, err)
	_, err = a.Ensure(ctx, vm, other, "")
	require.NoError(t, err)

	a.Forget(string(net.UID))
	_, ok := a.Known(vm, net, "")
	assert.False(t, ok, "the view of the forgotten network is gone")
	_, ok = a.Known(vm, other, "")
	assert.True(t, ok, "the other network's stays")
	again, err := a.Ensure(ctx, vm, net, "")
	require.NoError(t, err)
	assert.Equal(t, got, again, "the record, not the view, holds the address")
}

// Usage returns how many of network's addresses are given to VMs and how
// many it can give, for the network's status. It lists the network's records
// afresh, which also brings the Allocator's view up to date with what other
// replicas did.
func (a *Allocator) Usage(ctx context.Context, network *v1alpha1.VirtualNetwork) (allocated, total int, err error) {
	s, err := parseSubnet(network)
	if err != nil {
		return 0, 0, err
	}
	v := a.view(network)
	v.mu.Lock()
	defer v.mu.Unlock()
	if err := a.load(ctx, v, network, s); err != nil {
		return 0, 0, err
	}
	if err := a.refresh(ctx, v); err != nil {
		return 0, 0, err
	}
	return len(v.held), s.total(), nil
}
