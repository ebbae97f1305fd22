package benchmark

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
)

func TestProgressSaysHowFarARunIs(t *testing.T) {
	tr := newTracker(3)
	start := time.Now()
	for _, n := range []string{"vm-0", "vm-1", "vm-2"} {
		tr.markCreated(n, start)
	}
	tr.markRunning("vm-0", start)

	var (
		mu    sync.Mutex
		lines []string
	)
	progress := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		lines = append(lines, fmt.Sprintf(format, args...))
	}
	stopped := make(chan struct{})
	go func() {
		tr.report(context.Background(), start, 20*time.Millisecond, progress)
		close(stopped)
	}()
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(lines) > 0 }, 5*time.Second, 10*time.Millisecond)
	mu.Lock()
	assert.Contains(t, lines[0], "3 of 3 created, 1 Running")
	mu.Unlock()

	tr.markRunning("vm-1", time.Now())
	tr.markRunning("vm-2", time.Now())
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		t.Fatal("the progress display did not stop once every VM was Running")
	}
}

func TestSpreadCountsNodesAddressesAndDuplicates(t *testing.T) {
	s := runtime.NewScheme()
	require.NoError(t, v1alpha1.AddToScheme(s))
	vm := func(name, node string, ifaces ...v1alpha1.InterfaceStatus) client.Object {
		v := &v1alpha1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}}
		v.Status.AtProvider.Node, v.Status.AtProvider.Interfaces = node, ifaces
		return v
	}
	on := func(network string, ips ...string) v1alpha1.InterfaceStatus {
		return v1alpha1.InterfaceStatus{Network: network, IPs: ips}
	}
	kube := fake.NewClientBuilder().WithScheme(s).WithObjects(
		vm("vm-0000", "node1", on("net", "10.0.0.2")),
		vm("vm-0001", "node2", on("net", "10.0.0.2")),
		vm("vm-0002", "node2", on("net", "10.0.0.2"), on("other", "10.0.0.3")),
		vm("vm-0003", "node1", on("other", "10.0.0.2")),
		vm("vm-0004", "node1", on("net")),
		vm(warmUpName+"-0", "node3", on("net", "10.0.0.2")),
	).Build()
	perNode, addressed, duplicates, err := spread(context.Background(), kube)
	require.NoError(t, err)
	assert.Equal(t, map[string]int{"node1": 3, "node2": 2}, perNode, "warm-up VMs are not the run's")
	assert.Equal(t, 4, addressed, "a VM with an interface without address is not addressed")
	assert.Equal(t, 2, duplicates, "three VMs show 10.0.0.2 on net; the same address on another network is no duplicate")
}

// TestTheNetworkHoldsEveryVM: a scenario's network has an address for each
// of its VMs (a 100,000-VM burst on the /16 ran out at 65,533), and is no
// larger than it must be beyond the /16.
func TestTheNetworkHoldsEveryVM(t *testing.T) {
	tests := []struct {
		vms  int
		cidr string
	}{
		{vms: 1010, cidr: "10.20.0.0/16"},
		{vms: 65533, cidr: "10.20.0.0/16"},
		{vms: 65534, cidr: "10.20.0.0/15"},
		{vms: 101000, cidr: "10.20.0.0/15"},
		{vms: 200000, cidr: "10.20.0.0/14"},
		{vms: 300000, cidr: "10.16.0.0/13"},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprint(tc.vms), func(t *testing.T) {
			assert.Equal(t, tc.cidr, fleetFor(tc.vms).CIDR)
		})
	}
}
