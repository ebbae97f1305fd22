package libvirttest

import (
	"context"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"
	"github.com/stretchr/testify/require"
	"libvirt.org/go/libvirtxml"
)

func defineDomain(t *testing.T, l *libvirt.Libvirt, name string) {
	t.Helper()
	x, err := (&libvirtxml.Domain{
		Type:   "test",
		Name:   name,
		Memory: &libvirtxml.DomainMemory{Value: 64, Unit: "MiB"},
		OS:     &libvirtxml.DomainOS{Type: &libvirtxml.DomainOSType{Type: "hvm"}},
	}).Marshal()
	require.NoError(t, err)
	_, err = l.DomainDefineXMLFlags(x, 0)
	require.NoError(t, err)
}

func lookup(l *libvirt.Libvirt, name string) error {
	_, err := l.DomainLookupByName(name)
	return err
}

func TestNode(t *testing.T) {
	a := Start(t, "a")
	b := Start(t, "b")

	t.Run("StateSurvivesClientReconnectsBecauseOfTheKeeper", func(t *testing.T) {
		l, err := a.Dial()
		require.NoError(t, err)
		defineDomain(t, l, "kept")
		require.NoError(t, l.Disconnect())

		l, err = a.Dial()
		require.NoError(t, err)
		defer l.Disconnect() //nolint:errcheck // test cleanup
		require.NoError(t, lookup(l, "kept"))
	})

	t.Run("NodesDoNotShareState", func(t *testing.T) {
		l, err := b.Dial()
		require.NoError(t, err)
		defer l.Disconnect() //nolint:errcheck // test cleanup
		require.Error(t, lookup(l, "kept"), "a domain defined on node a must not exist on node b")
	})

	t.Run("RestartStartsFromAFreshTestDriverState", func(t *testing.T) {
		start := time.Now()
		require.NoError(t, a.Restart(context.Background()))
		t.Logf("libvirtd restarted and ready in %s", time.Since(start))

		l, err := a.Dial()
		require.NoError(t, err)
		defer l.Disconnect() //nolint:errcheck // test cleanup
		require.Error(t, lookup(l, "kept"), "the test driver keeps nothing across a daemon restart")
		require.NoError(t, lookup(l, "test"), "a fresh state holds the test driver's sample domain")
	})

	t.Run("KilledDaemonRefusesConnections", func(t *testing.T) {
		b.Kill()
		_, err := b.Dial()
		require.Error(t, err)
	})
}

func TestCallCounter(t *testing.T) {
	n := Start(t, "count")
	calls := n.CountCalls(t)
	l, err := Dial(calls.Socket)
	require.NoError(t, err)
	defer l.Disconnect() //nolint:errcheck // test cleanup
	calls.Reset()

	require.NoError(t, lookup(l, "test"), "the test driver's own domain, through the counter")
	require.Error(t, lookup(l, "none"), "a failed call is a round trip too")
	_, err = l.ConnectGetCapabilities()
	require.NoError(t, err)
	require.Equal(t, 3, calls.Total(), calls.String())
	require.Equal(t, "proc 7 ×1, proc 23 ×2", calls.String(), "REMOTE_PROC_CONNECT_GET_CAPABILITIES is 7, REMOTE_PROC_DOMAIN_LOOKUP_BY_NAME 23")

	calls.Reset()
	require.Zero(t, calls.Total())
}
