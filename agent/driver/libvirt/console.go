package libvirt

import (
	"cmp"
	"context"
	"io"
	"net"
	"path"
	"path/filepath"
	"strings"
	"sync"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	golibvirt "github.com/digitalocean/go-libvirt"

	"github.com/virtfleet/virtfleet/agent/driver"
)

var _ driver.Consoler = (*Driver)(nil)

// consoles are where guests' console sockets are and the sessions open on
// them.
//
// libvirt's own console stream cannot carry input through go-libvirt
// (its DomainOpenConsole only reads), so each guest's first serial port
// and its VNC display listen on unix sockets of their own (domainXML), and
// a session is a connection to one of them.
type consoles struct {
	// dir is Config.ConsoleDir as libvirtd sees it, where guests defined
	// from now on get their serial sockets; local is the same directory as
	// the agent sees it.
	dir, local string

	mu sync.Mutex
	// open are the sessions open, per guest and kind. QEMU serves a
	// serial port's socket to one client at a time and leaves a second
	// one waiting, unanswered, until the first leaves: the driver refuses
	// it at once instead. A display is held to one session too, so that
	// two users' keys and pointers never mix. (A client that is not this
	// driver's, on a serial socket, goes unnoticed: the session then
	// waits for it.)
	open map[session]bool
}

type session struct {
	uid  string
	kind driver.ConsoleKind
}

func newConsoles(cfg Config) *consoles {
	dir := path.Clean(cmp.Or(cfg.ConsoleDir, DefaultConsoleDir))
	return &consoles{dir: dir, local: filepath.Clean(cmp.Or(cfg.ConsoleLocalDir, dir)), open: map[session]bool{}}
}

// localPath is where the agent finds the socket libvirtd knows as p: under
// ConsoleLocalDir when p is under ConsoleDir, else p itself.
func (c *consoles) localPath(p string) string {
	rel, ok := strings.CutPrefix(path.Clean(p), strings.TrimSuffix(c.dir, "/")+"/")
	if !ok {
		return p
	}
	return filepath.Join(c.local, filepath.FromSlash(rel))
}

// connect opens the session kind of guest uid on the socket at local.
func (c *consoles) connect(ctx context.Context, uid string, kind driver.ConsoleKind, local string) (io.ReadWriteCloser, error) {
	key := session{uid: uid, kind: kind}
	c.mu.Lock()
	if c.open[key] {
		c.mu.Unlock()
		return nil, driver.Terminalf("%s console is in use by another session: guest %s serves one at a time", kind, uid)
	}
	c.open[key] = true
	c.mu.Unlock()
	var dialer net.Dialer
	conn, err := dialer.DialContext(ctx, "unix", local)
	if err != nil {
		c.release(key)
		return nil, errors.Wrapf(err, "cannot connect to the %s console of guest %s", kind, uid)
	}
	s := &sessionConn{Conn: conn}
	s.release = func() { c.release(key) }
	return s, nil
}

func (c *consoles) release(key session) {
	c.mu.Lock()
	delete(c.open, key)
	c.mu.Unlock()
}

// sessionConn is a console session: its socket connection, which frees
// the console when it is closed. It is a net.Conn, so a relay can set
// deadlines on it.
type sessionConn struct {
	net.Conn
	once    sync.Once
	release func()
}

// Close ends the session: the connection is closed before the console is
// freed, so QEMU has been told the last session ended before the next one
// connects.
func (s *sessionConn) Close() error {
	err := s.Conn.Close()
	s.once.Do(s.release)
	return err
}

// OpenConsole implements driver.Consoler. The stream of a serial console
// is the serial port's bytes; that of a VNC display is the RFB protocol
// from the server's ProtocolVersion on, without authentication (the socket
// is reachable on the host alone). The sockets are read from the guest's
// running definition, so a guest keeps its consoles across a change of
// Config.ConsoleDir until its next start.
func (d *Driver) OpenConsole(ctx context.Context, uid string, kind driver.ConsoleKind) (io.ReadWriteCloser, error) {
	if kind != driver.ConsoleSerial && kind != driver.ConsoleVNC {
		return nil, driver.Terminalf("no console of kind %q: a guest has a %s console and a %s display", kind, driver.ConsoleSerial, driver.ConsoleVNC)
	}
	api, _, err := d.api()
	if err != nil {
		return nil, err
	}
	dom, info, err := d.lookup(api, uid, 0)
	if err != nil {
		return nil, err
	}
	state, reason, err := api.DomainGetState(dom, 0)
	if err != nil {
		return nil, errors.Wrap(err, "cannot read domain state")
	}
	switch s := golibvirt.DomainState(state); {
	case movedAway(s, reason):
		return nil, driver.NotFoundf("guest %s moved to another node by live migration", uid)
	case s == golibvirt.DomainShutoff || s == golibvirt.DomainCrashed || s == golibvirt.DomainNostate:
		return nil, driver.Terminalf("guest %s is not running: its consoles are there only while it runs", uid)
	case d.testDriver:
		return nil, driver.Terminalf("guest %s runs on libvirt's test driver, which runs no QEMU: the test driver has no consoles", uid)
	}
	socket, err := socketOf(uid, info, kind)
	if err != nil {
		return nil, err
	}
	return d.consoles.connect(ctx, uid, kind, d.consoles.localPath(socket))
}

// socketOf is the socket console kind listens on in info, the running
// definition of the guest uid.
func socketOf(uid string, info domainInfo, kind driver.ConsoleKind) (string, error) {
	socket := info.serialSocket
	if kind == driver.ConsoleVNC {
		socket = info.vncSocket
	}
	switch {
	case socket != "":
		return socket, nil
	case info.owner != nil && info.owner.Imported:
		return "", driver.Terminalf("guest %s runs on the definition it was imported with, which virtfleet never rewrites and which has no %s console socket", uid, kind)
	default:
		// Its definition was rewritten with the consoles when the agent
		// that gives them first ensured it; it runs on the old one until
		// its next start.
		return "", driver.Terminalf("guest %s runs on a definition from before guests had consoles: restart the VM to get a console", uid)
	}
}
