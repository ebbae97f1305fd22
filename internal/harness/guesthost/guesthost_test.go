package guesthost_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
	"libvirt.org/go/libvirtxml"

	"github.com/virtfleet/virtfleet/internal/harness/guesthost"
)

// The host's bridge lives in its namespace only, Describe tells a running
// daemon from a dead one, and Stop, after a crash too, leaves nothing
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

	assert.Empty(t, h.MigrationURI, "a host of its own listens for no migration")
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

	t.Run("AGuestsQEMUComesFirstOnTheMachine", func(t *testing.T) { guestComesFirst(t, h) })

	// What a failed test is told of the daemon, alive and after a crash.
	assert.Contains(t, h.Describe(), "libvirtd of "+h.Netns+": running, answers")
	h.Crash()
	assert.Contains(t, h.Describe(), "libvirtd of "+h.Netns+": exited (signal: killed)")

	h.Stop()
	stopped = true
	ns, err := exec.Command("ip", "netns", "list").Output()
	require.NoError(t, err)
	require.NotContains(t, string(ns), h.Netns)
	_, err = os.Stat(h.Dir)
	require.True(t, os.IsNotExist(err), "host directory %s is left", h.Dir)
}

// guestComesFirst starts a guest with no disk (its firmware finds nothing
// to boot and waits) and checks that its QEMU leads a session of its own,
// whose autogroup the daemon's hook gave nice -5 (see DaemonScript).
func guestComesFirst(t *testing.T, h *guesthost.Host) {
	l, err := h.Dial()
	require.NoError(t, err)
	defer func() { _ = l.Disconnect() }()
	x, err := (&libvirtxml.Domain{
		Type:   guesthost.DomainType,
		Name:   "vfgh-first",
		Memory: &libvirtxml.DomainMemory{Value: 32, Unit: "MiB"},
		OS:     &libvirtxml.DomainOS{Type: &libvirtxml.DomainOSType{Arch: "x86_64", Type: "hvm"}},
	}).Marshal()
	require.NoError(t, err)
	d, err := l.DomainCreateXML(x, 0)
	require.NoError(t, err)
	defer func() { assert.NoError(t, l.DomainDestroy(d)) }()
	pidFile, err := os.ReadFile(filepath.Join(h.Dir, "run", "qemu", d.Name+".pid"))
	require.NoError(t, err)
	pid := strings.TrimSpace(string(pidFile))
	session := func(pid string) string {
		out, err := exec.Command("ps", "-o", "sid=", "-p", pid).Output()
		require.NoError(t, err)
		return strings.TrimSpace(string(out))
	}
	assert.NotEqual(t, session(strconv.Itoa(os.Getpid())), session(pid), "QEMU is in a session, so an autogroup, of its own")
	var group string
	assert.Eventually(t, func() bool {
		b, err := os.ReadFile(filepath.Join("/proc", pid, "autogroup"))
		group = fmt.Sprint(string(b), err)
		return err == nil && strings.HasSuffix(strings.TrimSpace(string(b)), " nice -5")
	}, 10*time.Second, 100*time.Millisecond, "QEMU's autogroup: %s", group)
}

// A pair is two hypervisors to libvirt (each its own host UUID) joined by an
// underlay only their namespaces see, which carries VXLAN; Close leaves
// nothing behind.
func TestPairIsTwoHostsOnOneUnderlay(t *testing.T) {
	if m := guesthost.Missing(); len(m) > 0 {
		t.Skipf("needs %v (make deps, as root)", m)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p, err := guesthost.StartPair(ctx, "vfpr", os.Stderr)
	require.NoError(t, err)
	closed := false
	defer func() {
		if !closed {
			p.Close()
		}
	}()

	t.Run("EachDaemonIsAHostOfItsOwn", func(t *testing.T) {
		for _, h := range p.Hosts() {
			l, err := h.Dial()
			require.NoError(t, err)
			x, err := l.ConnectGetCapabilities()
			require.NoError(t, err)
			require.NoError(t, l.Disconnect())
			var caps libvirtxml.Caps
			require.NoError(t, caps.Unmarshal(x))
			assert.Equal(t, h.UUID, caps.Host.UUID, "the daemon in %s has the host_uuid it was given", h.Netns)
		}
		assert.NotEqual(t, p.A.UUID, p.B.UUID)
	})

	t.Run("TheUnderlayJoinsTheNamespacesOnly", func(t *testing.T) {
		for _, h := range p.Hosts() {
			out, err := h.Command(ctx, "ip", "-br", "addr", "show", guesthost.UnderlayLink).CombinedOutput()
			require.NoError(t, err, string(out))
			assert.Regexp(t, `\sUP\s+`+regexp.QuoteMeta(h.TunnelAddress)+`/30`, string(out))
		}
		reach(t, p.A, p.B, p.B.TunnelAddress)
		reach(t, p.B, p.A, p.A.TunnelAddress)
		assertNotInMachinesNamespace(t, guesthost.UnderlayLink)
	})

	t.Run("EachDaemonListensForMigrationsOnItsUnderlayAddressOnly", func(t *testing.T) {
		for _, c := range []struct{ from, to *guesthost.Host }{{p.A, p.B}, {p.B, p.A}} {
			assert.Equal(t, "qemu+tcp://"+c.to.TunnelAddress+"/system", c.to.MigrationURI)
			var conn net.Conn
			require.NoError(t, guesthost.Within(c.from.NetnsPath, func() (err error) {
				conn, err = net.DialTimeout("tcp", net.JoinHostPort(c.to.TunnelAddress, libvirtdTCPPort), 5*time.Second)
				return err
			}), "from %s to %s's daemon", c.from.Netns, c.to.Netns)
			l := libvirt.New(conn) //nolint:staticcheck // a connection dialled inside a namespace
			require.NoError(t, l.ConnectToURI(libvirt.ConnectURI(guesthost.URI)))
			x, err := l.ConnectGetCapabilities()
			require.NoError(t, err)
			require.NoError(t, l.Disconnect())
			var caps libvirtxml.Caps
			require.NoError(t, caps.Unmarshal(x))
			assert.Equal(t, c.to.UUID, caps.Host.UUID, "the daemon there is %s's", c.to.Netns)

			err = guesthost.Within(c.to.NetnsPath, func() error {
				conn, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", libvirtdTCPPort), 5*time.Second)
				if err == nil {
					_ = conn.Close()
				}
				return err
			})
			assert.ErrorIs(t, err, unix.ECONNREFUSED, "%s's daemon listens on its underlay address alone", c.to.Netns)
		}
	})

	t.Run("VXLANRunsOverTheUnderlay", func(t *testing.T) {
		overlay := map[*guesthost.Host]string{p.A: "10.254.253.1", p.B: "10.254.253.2"}
		for _, h := range p.Hosts() {
			peer := p.A
			if h == p.A {
				peer = p.B
			}
			for _, args := range [][]string{
				{"link", "add", "vxcheck", "type", "vxlan", "id", "4242", "local", h.TunnelAddress, "remote", peer.TunnelAddress, "dstport", "4789", "dev", guesthost.UnderlayLink},
				{"addr", "add", overlay[h] + "/30", "dev", "vxcheck"},
				{"link", "set", "vxcheck", "up"},
			} {
				out, err := h.Command(ctx, "ip", args...).CombinedOutput()
				require.NoError(t, err, "ip %v in %s: %s", args, h.Netns, out)
			}
			underlay, err := h.UnderlayMTU(ctx)
			require.NoError(t, err)
			out, err := h.Command(ctx, "cat", "/sys/class/net/vxcheck/mtu").CombinedOutput()
			require.NoError(t, err, string(out))
			assert.Equal(t, strconv.Itoa(underlay-50), strings.TrimSpace(string(out)), "VXLAN over IPv4 takes 50 bytes of the underlay's MTU")
		}
		reach(t, p.A, p.B, overlay[p.B])
		assertNotInMachinesNamespace(t, "vxcheck")
	})

	p.Close()
	closed = true
	ns, err := exec.Command("ip", "netns", "list").Output()
	require.NoError(t, err)
	for _, h := range p.Hosts() {
		assert.NotContains(t, string(ns), h.Netns)
		_, err = os.Stat(h.Dir)
		assert.True(t, os.IsNotExist(err), "host directory %s is left", h.Dir)
	}
	assertNotInMachinesNamespace(t, guesthost.UnderlayLink)
}

// libvirtdTCPPort is where libvirtd listens for TCP connections by default.
const libvirtdTCPPort = "16509"

// reach connects over TCP from a socket in from's namespace to a listener
// in to's namespace on addr: the machine has no ping, and a connection that
// carries bytes both ways proves as much.
func reach(t *testing.T, from, to *guesthost.Host, addr string) {
	t.Helper()
	var l net.Listener
	require.NoError(t, guesthost.Within(to.NetnsPath, func() (err error) {
		l, err = net.Listen("tcp", net.JoinHostPort(addr, "0"))
		return err
	}))
	defer func() { _ = l.Close() }()
	go func() {
		if c, err := l.Accept(); err == nil {
			_, _ = c.Write([]byte("hello from " + to.Netns))
			_ = c.Close()
		}
	}()
	var got []byte
	require.NoError(t, guesthost.Within(from.NetnsPath, func() error {
		c, err := net.DialTimeout("tcp", l.Addr().String(), 5*time.Second)
		if err != nil {
			return err
		}
		defer func() { _ = c.Close() }()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		got, err = io.ReadAll(c)
		return err
	}), "from %s to %s in %s", from.Netns, l.Addr(), to.Netns)
	assert.Equal(t, "hello from "+to.Netns, string(got))
}

func assertNotInMachinesNamespace(t *testing.T, link string) {
	t.Helper()
	out, err := exec.Command("ip", "-o", "link", "show").Output()
	require.NoError(t, err)
	assert.NotRegexp(t, `(?m)^\d+: `+link+`[@:]`, string(out), "the machine's own namespace has no %s", link)
}
