package guesthost_test

import (
	"context"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/virtfleet/virtfleet/internal/testing/guesthost"
)

// The host's bridge lives in its namespace only, and Stop leaves nothing
// behind: no namespace, no directory.
func TestHostKeepsItsNetworkInItsNamespace(t *testing.T) {
	if m := guesthost.Missing(); len(m) > 0 {
		t.Skipf("needs %v (make deps, as root)", m)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	h, err := guesthost.Start(ctx, "vfgh", os.Stderr)
	require.NoError(t, err)
	stopped := false
	defer func() {
		if !stopped {
			h.Stop()
		}
	}()

	inside, err := h.Command(ctx, "ip", "-br", "addr", "show", "virbr0").CombinedOutput()
	require.NoError(t, err, string(inside))
	require.Contains(t, string(inside), "192.168.122.1/24")

	l, err := h.Dial()
	require.NoError(t, err)
	p, err := l.StoragePoolLookupByName(guesthost.Pool)
	require.NoError(t, err)
	active, err := l.StoragePoolIsActive(p)
	require.NoError(t, err)
	require.EqualValues(t, 1, active)
	require.NoError(t, l.Disconnect())

	h.Stop()
	stopped = true
	ns, err := exec.Command("ip", "netns", "list").Output()
	require.NoError(t, err)
	require.NotContains(t, string(ns), h.Netns)
	_, err = os.Stat(h.Dir)
	require.True(t, os.IsNotExist(err), "host directory %s is left", h.Dir)
}
