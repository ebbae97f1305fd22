package controlplane

import (
	"bufio"
	"context"
	"net"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apiserver/pkg/server/egressselector"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
)

// TestTheAPIServersEgressReachesRoutedNetworks drives the egress proxy with
// the API server's own egress client (k8s.io/apiserver's egressselector,
// reading the configuration the proxy wrote for kube-apiserver): an address
// of a routed prefix goes through its route's dialer, any other is dialed
// from this machine, a route that cannot dial fails the API server's dial,
// and a route overlapping another is refused.
func TestTheAPIServersEgressReachesRoutedNetworks(t *testing.T) {
	s := &envtest.APIServer{}
	dir := t.TempDir()
	e, err := startEgress(s, dir)
	require.NoError(t, err)
	t.Cleanup(e.relay.Cut)
	assert.Equal(t, []string{"true"}, s.Configure().Get("enable-aggregator-routing").Get(nil), "the aggregator dials endpoints, which routes reach")
	file := filepath.Join(dir, "egress-selector.yaml")
	assert.Equal(t, []string{file}, s.Configure().Get("egress-selector-config-file").Get(nil))

	cfg, err := egressselector.ReadEgressSelectorConfiguration(file)
	require.NoError(t, err)
	require.Empty(t, egressselector.ValidateEgressSelectorConfiguration(cfg))
	selector, err := egressselector.NewEgressSelector(cfg)
	require.NoError(t, err)
	dial, err := selector.Lookup(egressselector.Cluster.AsNetworkContext())
	require.NoError(t, err)
	require.NotNil(t, dial, "the cluster's egress goes through the proxy")

	// This machine's server, and a network only the route reaches (the
	// documentation's TEST-NET-1). Both answer once the client spoke, as
	// the TLS servers the API server dials do: the API server's client
	// refuses bytes that arrive with the proxy's answer.
	answer := func(c net.Conn, what string) {
		defer func() { _ = c.Close() }()
		if _, err := bufio.NewReader(c).ReadString('\n'); err == nil {
			_, _ = c.Write([]byte(what))
		}
	}
	machine, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = machine.Close() })
	go func() {
		for {
			c, err := machine.Accept()
			if err != nil {
				return
			}
			go answer(c, "machine\n")
		}
	}()
	routed := func(addr string) (net.Conn, error) {
		if addr == "192.0.2.99:443" {
			return nil, errors.New("nothing listens there")
		}
		ours, theirs := net.Pipe()
		go answer(theirs, "routed "+addr+"\n")
		return ours, nil
	}
	unroute, err := e.route(routed, netip.MustParsePrefix("192.0.2.0/24"))
	require.NoError(t, err)

	cases := map[string]struct {
		addr string
		want string
	}{
		"ARoutedAddressGoesThroughItsRoute": {addr: "192.0.2.7:9444", want: "routed 192.0.2.7:9444\n"},
		"AnyOtherFromThisMachine":           {addr: machine.Addr().String(), want: "machine\n"},
		"ARouteThatCannotDialFailsTheDial":  {addr: "192.0.2.99:443"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			c, err := dial(ctx, "tcp", tc.addr)
			if tc.want == "" {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			defer func() { _ = c.Close() }()
			_, err = c.Write([]byte("hello\n"))
			require.NoError(t, err)
			got, err := bufio.NewReader(c).ReadString('\n')
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}

	_, err = e.route(routed, netip.MustParsePrefix("192.0.2.128/25"))
	require.Error(t, err, "a prefix inside a routed one is ambiguous")
	unroute()
	unrouteAgain, err := e.route(routed, netip.MustParsePrefix("192.0.2.128/25"))
	require.NoError(t, err, "the route is gone")
	unrouteAgain()
}
