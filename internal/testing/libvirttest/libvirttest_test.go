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
