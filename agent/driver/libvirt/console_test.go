package libvirt

import (
	"bytes"
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"libvirt.org/go/libvirtxml"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/internal/harness/guesthost"
	"github.com/virtfleet/virtfleet/internal/harness/libvirttest"
)

// Every guest's serial port and display listen on unix sockets the agent
// connects to, nothing listens on TCP, and the boot log goes on.
func TestDomainXMLConsoles(t *testing.T) {
	useSerial := &libvirtxml.DomainBIOS{UseSerial: "yes"}
	cases := map[string]struct {
		firmware   driver.Firmware
		consoleDir string
		wantDir    string
		// bios is SeaBIOS's writing to the serial port; nil on UEFI.
		bios *libvirtxml.DomainBIOS
	}{
		"BIOSPrintsTheBootOnTheSerialPort":      {firmware: driver.FirmwareBIOS, wantDir: DefaultConsoleDir, bios: useSerial},
		"NoFirmwareNamedIsBIOS":                 {wantDir: DefaultConsoleDir, bios: useSerial},
		"UEFIHasNoSeaBIOSToTell":                {firmware: driver.FirmwareUEFI, wantDir: DefaultConsoleDir},
		"TheSerialSocketGoesWhereTheNodeSays":   {consoleDir: "/srv/consoles", wantDir: "/srv/consoles", bios: useSerial},
		"UEFIInAConfiguredDirectory":            {firmware: driver.FirmwareUEFI, consoleDir: "/srv/consoles/", wantDir: "/srv/consoles"},
		"BIOSWithTheDefaultDirectorySpelledOut": {firmware: driver.FirmwareBIOS, consoleDir: DefaultConsoleDir, wantDir: DefaultConsoleDir, bios: useSerial},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			m := machine("cons")
			m.Firmware = tc.firmware
			x, err := domainXML(domainSpec{machine: m, owner: ownership{UID: m.UID}, domainType: "kvm", pool: "default", consoleDir: tc.consoleDir})
			require.NoError(t, err)
			var d libvirtxml.Domain
			require.NoError(t, d.Unmarshal(x))

			serial := tc.wantDir + "/vf-" + m.UID + ".serial"
			require.Len(t, d.Devices.Serials, 1)
			s := d.Devices.Serials[0]
			assert.Equal(t, &libvirtxml.DomainChardevSource{UNIX: &libvirtxml.DomainChardevSourceUNIX{Mode: "bind", Path: serial}}, s.Source, "QEMU listens, the agent connects")
			assert.Equal(t, &libvirtxml.DomainChardevLog{File: ConsoleLog(domainName(m)), Append: "on"}, s.Log, "the boot log is kept as before")
			assert.Empty(t, d.Devices.Consoles, "libvirt adds the console of the serial port itself")

			require.Len(t, d.Devices.Graphics, 1, "one display")
			g := d.Devices.Graphics[0]
			require.NotNil(t, g.VNC, "a VNC display")
			assert.Equal(t, []libvirtxml.DomainGraphicListener{{Socket: &libvirtxml.DomainGraphicListenerSocket{}}}, g.VNC.Listeners, "on a socket libvirt makes, alone")
			assert.Empty(t, g.VNC.Socket, "libvirt names the socket at start")
			assert.Zero(t, g.VNC.Port, "no TCP port")
			assert.Empty(t, g.VNC.AutoPort, "no TCP port picked by libvirt")
			assert.Empty(t, g.VNC.Listen, "no TCP address")
			assert.Zero(t, g.VNC.WebSocket, "no websocket port")
			assert.Nil(t, g.Spice, "no SPICE, which would listen on TCP")
			assert.Nil(t, g.RDP, "no RDP, which would listen on TCP")
			require.Len(t, d.Devices.Videos, 1)
			assert.Equal(t, "vga", d.Devices.Videos[0].Model.Type)

			assert.Equal(t, tc.bios, d.OS.BIOS)

			info, err := parseDomain(x)
			require.NoError(t, err)
			assert.Equal(t, serial, info.serialSocket)
			assert.Empty(t, info.vncSocket, "a definition not running has no VNC socket yet")
		})
	}
}

// A session connects to the socket the running definition names; a guest
// running on a definition without it is told what to do.
func TestConsoleSocketOfARunningDefinition(t *testing.T) {
	m := machine("sock")
	x, err := domainXML(domainSpec{machine: m, owner: ownership{UID: m.UID}, domainType: "kvm", pool: "default"})
	require.NoError(t, err)
	const vnc = "/var/lib/libvirt/qemu/domain-7-team-a_sock-0b5e3f1a/vnc.sock"
	running := func(d *libvirtxml.Domain) {
		// As libvirt shows a running guest's display.
		d.Devices.Graphics[0].VNC.Socket = vnc
		d.Devices.Graphics[0].VNC.Listeners[0].Socket.Socket = vnc
	}
	old := func(d *libvirtxml.Domain) {
		// What an agent before consoles defined.
		d.Devices.Serials[0].Source = &libvirtxml.DomainChardevSource{Pty: &libvirtxml.DomainChardevSourcePty{Path: "/dev/pts/3"}}
		d.Devices.Graphics, d.Devices.Videos = nil, nil
	}
	tcpDisplay := func(d *libvirtxml.Domain) {
		d.Devices.Graphics[0].VNC = &libvirtxml.DomainGraphicVNC{Port: 5900, Listen: "127.0.0.1"}
	}
	imported := func(d *libvirtxml.Domain) {
		o := ownership{UID: m.UID, Imported: true}
		meta, err := o.marshal()
		require.NoError(t, err)
		d.Metadata.XML = meta
	}
	cases := map[string]struct {
		change []func(*libvirtxml.Domain)
		kind   driver.ConsoleKind
		want   string
		err    string
	}{
		"Serial":                        {change: []func(*libvirtxml.Domain){running}, kind: driver.ConsoleSerial, want: DefaultConsoleDir + "/vf-" + m.UID + ".serial"},
		"VNC":                           {change: []func(*libvirtxml.Domain){running}, kind: driver.ConsoleVNC, want: vnc},
		"SerialOfAnOldDefinition":       {change: []func(*libvirtxml.Domain){old}, kind: driver.ConsoleSerial, err: "restart the VM to get a console"},
		"VNCOfAnOldDefinition":          {change: []func(*libvirtxml.Domain){old}, kind: driver.ConsoleVNC, err: "restart the VM to get a console"},
		"ADisplayOnTCPIsNotServed":      {change: []func(*libvirtxml.Domain){tcpDisplay}, kind: driver.ConsoleVNC, err: "restart the VM to get a console"},
		"AnImportedDefinitionIsKept":    {change: []func(*libvirtxml.Domain){old, imported}, kind: driver.ConsoleSerial, err: "imported"},
		"AnImportedDefinitionWithASock": {change: []func(*libvirtxml.Domain){running, imported}, kind: driver.ConsoleVNC, want: vnc},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			var d libvirtxml.Domain
			require.NoError(t, d.Unmarshal(x))
			for _, change := range tc.change {
				change(&d)
			}
			live, err := d.Marshal()
			require.NoError(t, err)
			info, err := parseDomain(live)
			require.NoError(t, err)
			got, err := socketOf(m.UID, info, tc.kind)
			if tc.err != "" {
				require.Error(t, err)
				assert.True(t, driver.IsTerminal(err), "%v", err)
				assert.Contains(t, err.Error(), tc.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestConsoleSocketsMustFitASocketPath(t *testing.T) {
	m := machine("long")
	dir := "/" + strings.Repeat("d", maxSocketPath-len("//vf-"+m.UID+".serial"))
	_, err := domainXML(domainSpec{machine: m, owner: ownership{UID: m.UID}, domainType: "kvm", pool: "default", consoleDir: dir})
	require.NoError(t, err, "a serial socket of %d bytes fits", maxSocketPath)

	_, err = domainXML(domainSpec{machine: m, owner: ownership{UID: m.UID}, domainType: "kvm", pool: "default", consoleDir: dir + "d"})
	require.Error(t, err)
	assert.True(t, driver.IsFailing(err), "the node's configuration must change, and then the guest is defined: %v", err)
	assert.Contains(t, err.Error(), "too long")
}

// The sockets libvirtd names are found where the agent sees them.
func TestConsoleSocketsAsTheAgentSeesThem(t *testing.T) {
	cases := map[string]struct {
		cfg    Config
		socket string
		want   string
	}{
		"SameViewByDefault":           {socket: "/var/lib/libvirt/qemu/vf-u.serial", want: "/var/lib/libvirt/qemu/vf-u.serial"},
		"TheDaemonsDirectoryIsMapped": {cfg: Config{ConsoleLocalDir: "/tmp/h/lib/qemu"}, socket: "/var/lib/libvirt/qemu/vf-u.vnc", want: "/tmp/h/lib/qemu/vf-u.vnc"},
		"AConfiguredDirectoryIsMapped": {
			cfg:    Config{ConsoleDir: "/srv/c/", ConsoleLocalDir: "/mnt/c"},
			socket: "/srv/c/vf-u.serial", want: "/mnt/c/vf-u.serial",
		},
		"ASocketElsewhereIsTakenAsItIs": {cfg: Config{ConsoleLocalDir: "/tmp/h/lib/qemu"}, socket: "/run/other/vf-u.serial", want: "/run/other/vf-u.serial"},
		"ADirectoryOfTheSamePrefixIsNotIt": {
			cfg:    Config{ConsoleLocalDir: "/tmp/h/lib/qemu"},
			socket: "/var/lib/libvirt/qemu-other/vf-u.serial", want: "/var/lib/libvirt/qemu-other/vf-u.serial",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			assert.Equal(t, tc.want, newConsoles(tc.cfg).localPath(tc.socket))
		})
	}
}

// A console serves one session at a time: a second is refused at once
// while the first is open, and closing the first frees it.
func TestConsoleSessions(t *testing.T) {
	dir, err := os.MkdirTemp("", "vfcons")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	serial, vnc := listen(t, filepath.Join(dir, "s")), listen(t, filepath.Join(dir, "v"))
	c := newConsoles(Config{})
	ctx := context.Background()
	const uid = "0b5e3f1a-7c2d-4e8f-9a1b-000000000001"

	first, err := c.connect(ctx, uid, driver.ConsoleSerial, serial)
	require.NoError(t, err)
	_, err = c.connect(ctx, uid, driver.ConsoleSerial, serial)
	require.Error(t, err, "a second session of the same console")
	assert.True(t, driver.IsTerminal(err), "%v", err)
	assert.Contains(t, err.Error(), "console is in use by another session")

	other, err := c.connect(ctx, uid, driver.ConsoleVNC, vnc)
	require.NoError(t, err, "the display is another console")
	require.NoError(t, other.Close())
	another, err := c.connect(ctx, "0b5e3f1a-7c2d-4e8f-9a1b-000000000002", driver.ConsoleSerial, serial)
	require.NoError(t, err, "another guest's console")
	require.NoError(t, another.Close())

	require.NoError(t, first.Close())
	_ = first.Close() // a second Close frees nothing else
	again, err := c.connect(ctx, uid, driver.ConsoleSerial, serial)
	require.NoError(t, err, "the closed session freed the console")
	_, err = c.connect(ctx, uid, driver.ConsoleSerial, serial)
	assert.True(t, driver.IsTerminal(err), "the second Close of the first session freed nothing: %v", err)
	require.NoError(t, again.Close())

	_, err = c.connect(ctx, uid, driver.ConsoleVNC, filepath.Join(dir, "nothing"))
	require.Error(t, err, "no socket there")
	assert.False(t, driver.IsTerminal(err), "a connection that fails is retried: %v", err)
	last, err := c.connect(ctx, uid, driver.ConsoleVNC, vnc)
	require.NoError(t, err, "a failed connection holds nothing")
	require.NoError(t, last.Close())
}

// listen serves a unix socket at p that accepts and holds connections.
func listen(t *testing.T, p string) string {
	t.Helper()
	l, err := net.Listen("unix", p)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { _ = c.Close() })
		}
	}()
	return p
}

// On the test driver (no QEMU) the definitions with consoles are accepted,
// and OpenConsole says what it can of each guest.
func TestConsolesOnTheTestDriver(t *testing.T) {
	ctx := context.Background()
	node := libvirttest.Start(t, "cons")
	d := open(t, node)
	l := raw(t, node)
	m := machine("console")
	_, err := d.Ensure(ctx, m)
	require.NoError(t, err)

	dom := domainOf(t, l, m.UID)
	x, err := l.DomainGetXMLDesc(dom, 0)
	require.NoError(t, err)
	var def libvirtxml.Domain
	require.NoError(t, def.Unmarshal(x))
	require.Len(t, def.Devices.Serials, 1)
	assert.Equal(t, DefaultConsoleDir+"/vf-"+m.UID+".serial", def.Devices.Serials[0].Source.UNIX.Path, "the test driver keeps the serial socket")
	require.Len(t, def.Devices.Graphics, 1)
	require.NotNil(t, def.Devices.Graphics[0].VNC, "the test driver keeps the display")
	assert.NotNil(t, def.Devices.Graphics[0].VNC.Listeners[0].Socket, "on its socket")

	cases := map[string]struct {
		uid      string
		kind     driver.ConsoleKind
		notFound bool
		want     string
	}{
		"SerialHasNoQEMU":         {uid: m.UID, kind: driver.ConsoleSerial, want: "test driver has no consoles"},
		"VNCHasNoQEMU":            {uid: m.UID, kind: driver.ConsoleVNC, want: "test driver has no consoles"},
		"NoSuchKind":              {uid: m.UID, kind: "spice", want: `no console of kind "spice"`},
		"NoSuchGuest":             {uid: "0b5e3f1a-7c2d-4e8f-9a1b-999999999999", kind: driver.ConsoleSerial, notFound: true},
		"TheStockTestVMIsNotOurs": {uid: testDomainUID(t, l), kind: driver.ConsoleSerial, want: "not managed by virtfleet"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := d.OpenConsole(ctx, tc.uid, tc.kind)
			require.Error(t, err)
			if tc.notFound {
				assert.True(t, driver.IsNotFound(err), "%v", err)
				return
			}
			assert.True(t, driver.IsTerminal(err), "%v", err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}

	t.Run("AStoppedGuestHasNoConsole", func(t *testing.T) {
		stopped := m
		stopped.Running = false
		o, err := d.Ensure(ctx, stopped)
		require.NoError(t, err)
		require.Equal(t, driver.PhaseStopped, o.Phase)
		_, err = d.OpenConsole(ctx, m.UID, driver.ConsoleSerial)
		assert.True(t, driver.IsTerminal(err), "%v", err)
		assert.Contains(t, err.Error(), "is not running")
	})
}

// testDomainUID is the UUID of the domain "test" a fresh test driver has.
func testDomainUID(t *testing.T, l *golibvirt.Libvirt) string {
	t.Helper()
	dom, err := l.DomainLookupByName("test")
	require.NoError(t, err)
	return formatUUID(dom.UUID)
}

// consoleTimeout bounds what a guest under emulation takes to show its
// firmware on the serial port, and each step of a session.
const consoleTimeout = 3 * time.Minute

// TestConsolesOfARealGuest opens the consoles of a guest under QEMU
// (guesthost), the agent outside libvirtd's mount namespace: its serial
// port, one session at a time, and its VNC display. The guest has no
// operating system (its disk is empty): SeaBIOS, writing to the serial
// port, is what the console shows, each time the guest is reset.
func TestConsolesOfARealGuest(t *testing.T) {
	if m := guesthost.Missing(); len(m) > 0 {
		t.Skipf("needs %v (make deps, as root)", m)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	h, err := guesthost.Start(ctx, "vfcon", os.Stderr)
	require.NoError(t, err)
	h.StopWith(t)
	d, err := Open(ctx, Config{
		Node: "real", Socket: h.Socket, URI: h.URI, Pool: guesthost.Pool, DomainType: guesthost.DomainType,
		ShutdownGrace: time.Second, ConsoleLocalDir: h.LibDir("qemu"),
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = d.Close() })
	l := dialHost(t, h)
	m := driver.Machine{
		UID:         "3c1d9e7a-5b2f-4a60-8e4d-1f2a3b4c5d6e",
		Namespace:   "team-a",
		Name:        "talker",
		Generation:  1,
		VCPU:        1,
		MemoryBytes: 128 << 20,
		Running:     true,
		Disks:       []driver.Disk{{Name: "talker-root", SizeBytes: 1 << 20}},
	}
	o, err := d.Ensure(ctx, m)
	require.NoError(t, err)
	require.Equal(t, driver.PhaseRunning, o.Phase, o.Message)
	dom := domainOf(t, l, m.UID)
	// boots waits until the guest's firmware, starting, shows want on the
	// session out reads, resetting the guest after wait and every 30 s
	// from then on: QEMU takes a session when it gets to it, and what the
	// guest wrote before then is in the log alone. Under TCG here, a reset
	// in the guest's first instants can leave its vCPU in its reset state
	// for good, so a guest just started is left to boot first.
	boots := func(t *testing.T, out *output, wait time.Duration, want ...string) {
		t.Helper()
		reset := time.Now().Add(wait)
		require.Eventually(t, func() bool {
			if out.has(want...) {
				return true
			}
			if time.Now().After(reset) {
				_ = l.DomainReset(dom, 0)
				reset = time.Now().Add(30 * time.Second)
			}
			return false
		}, consoleTimeout, 100*time.Millisecond, "the console shows %q", want)
	}

	t.Run("SerialShowsTheFirmwareOneSessionAtATime", func(t *testing.T) {
		first, err := d.OpenConsole(ctx, m.UID, driver.ConsoleSerial)
		require.NoError(t, err)
		defer first.Close()
		boots(t, record(first), 20*time.Second, "No bootable device")

		_, err = d.OpenConsole(ctx, m.UID, driver.ConsoleSerial)
		require.Error(t, err, "a second session while the first is open")
		assert.True(t, driver.IsTerminal(err), "%v", err)
		assert.Contains(t, err.Error(), "console is in use by another session")

		require.NoError(t, first.Close())
		second, err := d.OpenConsole(ctx, m.UID, driver.ConsoleSerial)
		require.NoError(t, err, "the first session freed the console")
		defer second.Close()
		boots(t, record(second), 0, "SeaBIOS", "No bootable device")
		require.NoError(t, second.Close())
	})

	t.Run("VNCSpeaksRFB", func(t *testing.T) {
		c, err := d.OpenConsole(ctx, m.UID, driver.ConsoleVNC)
		require.NoError(t, err)
		defer c.Close()
		conn, ok := c.(net.Conn)
		require.True(t, ok, "a session is a connection, with deadlines")
		require.NoError(t, conn.SetDeadline(time.Now().Add(consoleTimeout)))

		version := make([]byte, 12)
		_, err = io.ReadFull(c, version)
		require.NoError(t, err)
		assert.Equal(t, "RFB 003.008\n", string(version), "the server's ProtocolVersion")
		_, err = c.Write([]byte("RFB 003.008\n"))
		require.NoError(t, err)
		n := make([]byte, 1)
		_, err = io.ReadFull(c, n)
		require.NoError(t, err)
		require.NotZero(t, n[0], "the server offers security types (zero would be a refusal)")
		types := make([]byte, n[0])
		_, err = io.ReadFull(c, types)
		require.NoError(t, err)
		assert.Contains(t, types, byte(1), "None: the socket is on the host alone, and the hub decides who may connect")

		_, err = d.OpenConsole(ctx, m.UID, driver.ConsoleVNC)
		assert.True(t, driver.IsTerminal(err), "one VNC session at a time: %v", err)
		require.NoError(t, c.Close())
	})

	t.Run("AStoppedGuestHasNoConsole", func(t *testing.T) {
		stopped := m
		stopped.Running = false
		require.NoError(t, l.DomainDestroy(dom))
		o, err := d.Ensure(ctx, stopped)
		require.NoError(t, err)
		require.Equal(t, driver.PhaseStopped, o.Phase)
		_, err = d.OpenConsole(ctx, m.UID, driver.ConsoleSerial)
		assert.True(t, driver.IsTerminal(err), "%v", err)
		assert.Contains(t, err.Error(), "is not running")
	})
}

// output is what a session read, as it comes.
type output struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// record reads r until it ends.
func record(r io.Reader) *output {
	o := &output{}
	go func() {
		b := make([]byte, 4096)
		for {
			n, err := r.Read(b)
			o.mu.Lock()
			o.buf.Write(b[:n])
			o.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	return o
}

// has says whether all of want was read.
func (o *output) has(want ...string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, w := range want {
		if !strings.Contains(o.buf.String(), w) {
			return false
		}
	}
	return true
}
