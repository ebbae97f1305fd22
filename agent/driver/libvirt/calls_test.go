package libvirt

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/internal/harness/libvirttest"
)

// TestRoundTrips holds the driver's common operations to a budget of libvirt
// calls. Each call is a round trip to the daemon: in a burst, the agent's CPU
// goes mostly to the syscalls and wakeups of these (BenchmarkEnsureRunning's
// profile), and the daemon's to answering them.
func TestRoundTrips(t *testing.T) {
	ctx := context.Background()
	d, calls := openCounted(t, "calls")
	// The first guest makes the network; the budgets are for the ones after.
	_, err := d.Ensure(ctx, machine("first"))
	require.NoError(t, err)
	m := machine("counted")

	for _, tc := range []struct {
		name   string
		do     func() (driver.Observation, error)
		budget int
	}{
		{"a new guest: network and volumes checked, address reserved, root, swap and seed made, defined, started, observed", func() (driver.Observation, error) { return d.Ensure(ctx, m) }, 20},
		{"a guest already as it should be (the resync)", func() (driver.Observation, error) { return d.Ensure(ctx, m) }, 10},
		{"a running guest observed", func() (driver.Observation, error) { return d.Observe(ctx, m.UID) }, 8},
	} {
		t.Run(tc.name, func(t *testing.T) {
			calls.Reset()
			o, err := tc.do()
			require.NoError(t, err)
			require.Equal(t, driver.PhaseRunning, o.Phase)
			require.NotEmpty(t, o.Interfaces[0].IPs, "the test driver's guest has its address at once")
			require.LessOrEqual(t, calls.Total(), tc.budget, "libvirt calls: %s", calls)
		})
	}
}

// TestAFullObserveCostsAFewRoundTrips holds what a resync and a heartbeat
// ask of libvirt on a node where nothing changed to a budget that does not
// grow with the node's guests: the states of all domains in one call, each
// network the guests are on read once, and the definitions and the list of
// domains kept from the last look.
func TestAFullObserveCostsAFewRoundTrips(t *testing.T) {
	ctx := context.Background()
	d, calls := openCounted(t, "observe-calls")
	const guests = 12
	for i := range guests {
		m := machine(fmt.Sprintf("observed-%d", i))
		m.Running = i%3 != 0
		_, err := d.Ensure(ctx, m)
		require.NoError(t, err)
	}
	// The first look reads every definition.
	_, err := d.List(ctx)
	require.NoError(t, err)

	for _, tc := range []struct {
		name   string
		do     func() (int, error)
		budget int
	}{
		{"every guest observed: the states in one call, the one network read once", func() (int, error) {
			all, err := d.List(ctx)
			return len(all), err
		}, 3},
		{"the orphans: the states in one call", func() (int, error) {
			all, err := d.Orphans(ctx)
			return guests - len(all), err
		}, 1},
		{"a heartbeat: nothing", func() (int, error) {
			c, err := d.Capacity(ctx)
			return int(c.AllocatedVCPU) / 2, err
		}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			calls.Reset()
			got, err := tc.do()
			require.NoError(t, err)
			require.Equal(t, guests, got, "every guest counted")
			require.LessOrEqual(t, calls.Total(), tc.budget, "libvirt calls: %s", calls)
		})
	}
}

// Procedures of remote_protocol.x a driver's Close may or must not call.
const (
	procConnectClose                  = 2   // REMOTE_PROC_CONNECT_CLOSE
	procDomainEventCallbackDeregister = 317 // REMOTE_PROC_CONNECT_DOMAIN_EVENT_CALLBACK_DEREGISTER_ANY
)

// TestClosingLeavesTheEventCallbacksToTheDaemon holds Close to one call:
// the connection's close. Its event callbacks go with the connection, in
// libvirtd's own cleanup of it; a deregistration of each sent as the
// connection closes races that cleanup in the daemon (libvirt 9.0 logs
// callbacks it cannot find then, and was seen to read freed memory and
// die).
func TestClosingLeavesTheEventCallbacksToTheDaemon(t *testing.T) {
	d, calls := openCounted(t, "close")
	_, err := d.Ensure(context.Background(), machine("events"))
	require.NoError(t, err)
	calls.Reset()
	require.NoError(t, d.Close())
	// The counter reads what the client wrote on its own goroutine.
	require.Eventually(t, func() bool { return calls.Calls(procConnectClose) == 1 }, 5*time.Second, 10*time.Millisecond, "the connection closed: %s", calls)
	assert.Zero(t, calls.Calls(procDomainEventCallbackDeregister), "deregistrations sent on closing: %s", calls)
}

// openCounted opens a driver on a node of its own, name, through a call
// counter.
func openCounted(t testing.TB, name string) (*Driver, *libvirttest.CallCounter) {
	t.Helper()
	n := libvirttest.Start(t, name)
	calls := n.CountCalls(t)
	d, err := Open(context.Background(), Config{Node: n.Name, Socket: calls.Socket, URI: n.URI, Pool: testPool, ShutdownGrace: 50 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { _ = d.Close() })
	return d, calls
}

// TestAReservationIsKnownAsLibvirtHoldsIt checks what an Ensure observes
// its guest's network by instead of reading it again: the network as read
// before, with the reservation changes applied locally. After each kind of
// change (an address reserved, a MAC's address moved, an address taken
// from a stale reservation) the local copy must equal what libvirt holds.
func TestAReservationIsKnownAsLibvirtHoldsIt(t *testing.T) {
	ctx := context.Background()
	d, _ := openCounted(t, "reservations")
	first := machine("holder")
	_, err := d.Ensure(ctx, first)
	require.NoError(t, err)
	api, _, err := d.api()
	require.NoError(t, err)
	n := first.Networks[0]
	at := func(last byte) driver.Network {
		m := n
		m.Address = netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 10, 120, last}), 24)
		return m
	}

	for _, tc := range []struct {
		name string
		net  driver.Network
		mac  string
	}{
		{"an address reserved for a new MAC", at(200), "52:54:00:aa:00:01"},
		{"the MAC's reservation moved to another address", at(201), "52:54:00:aa:00:01"},
		{"an address whose reservation no guest holds taken over", at(201), "52:54:00:aa:00:02"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nets := newNetworkView(api)
			d.networkMu.Lock()
			err := d.ensureNetwork(api, tc.net, tc.mac, nets)
			d.networkMu.Unlock()
			require.NoError(t, err)
			known := nets.nets[n.Name]
			require.NotNil(t, known, "the view knows the network without reading it")
			fresh := newNetworkView(api).network(n.Name)
			require.NoError(t, fresh.err)
			require.Equal(t, hostsOf(fresh.nw), hostsOf(known.nw))
			require.Contains(t, hostsOf(known.nw), strings.ToLower(tc.mac)+"="+tc.net.Address.Addr().String())
		})
	}
}

// hostsOf lists nw's DHCP reservations as mac=ip, in order.
func hostsOf(nw network) []string {
	var out []string
	for _, ip := range nw.def.IPs {
		for _, h := range dhcpHosts(ip) {
			out = append(out, strings.ToLower(h.MAC)+"="+h.IP)
		}
	}
	return out
}
