package guesthost

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
)

// UnderlayLink is the name, inside each host's namespace, of its end of a
// Pair's underlay.
const UnderlayLink = "underlay"

// The underlay is a /30 that exists only on the veth pair between the two
// hosts' namespaces: the machine's own namespace never sees it, so it can
// clash with nothing there, nor with another run's pair.
const underlayPrefix = 30

var underlayAddresses = [2]string{"192.168.253.1", "192.168.253.2"}

// Pair is two hosts joined by an underlay: a veth pair with one end in each
// host's namespace (UnderlayLink, up, with the host's TunnelAddress), the
// network two hypervisors' overlays run on. Each host's libvirtd listens
// for the other's migrations on its underlay address only (MigrationURI).
type Pair struct {
	A, B *Host
	// shared are SharedPool's directories, which Close removes.
	shared []string
}

// StartPair starts two hosts, named prefix+"a" and prefix+"b", and joins
// them. progress gets a line per step.
//
// The underlay is made before the daemons start: libvirtd binds its TCP
// listener to the tunnel address when it starts, and the address must be
// there by then.
func StartPair(ctx context.Context, prefix string, progress io.Writer) (*Pair, error) {
	p := &Pair{}
	var err error
	if p.A, err = create(ctx, prefix+"a"); err != nil {
		return nil, err
	}
	if p.B, err = create(ctx, prefix+"b"); err != nil {
		p.Close()
		return nil, err
	}
	if err := p.join(ctx); err != nil {
		p.Close()
		return nil, err
	}
	for _, h := range p.Hosts() {
		if err := h.listenForMigrations(); err != nil {
			p.Close()
			return nil, err
		}
		if err := h.run(ctx, progress, "--listen"); err != nil {
			p.Close()
			return nil, err
		}
	}
	return p, nil
}

// listenForMigrations has the daemon accept connections from the other
// host's daemon, which a peer-to-peer migration opens, on the underlay
// alone: plain TCP without authentication, which only the two namespaces
// can reach.
func (h *Host) listenForMigrations() error {
	h.MigrationURI = "qemu+tcp://" + h.TunnelAddress + "/system"
	return h.configure("The other host of the pair migrates guests here over the underlay, and nothing else reaches it.",
		"listen_tcp = 1", "listen_tls = 0", `auth_tcp = "none"`, fmt.Sprintf("listen_addr = %q", h.TunnelAddress))
}

// Hosts are A and B, in that order.
func (p *Pair) Hosts() []*Host { return []*Host{p.A, p.B} }

// join makes the underlay. Each end is made right in its namespace, so
// neither ever exists in the machine's own.
func (p *Pair) join(ctx context.Context) error {
	if out, err := exec.CommandContext(ctx, "ip", "-n", p.A.Netns, "link", "add", UnderlayLink, "type", "veth",
		"peer", "name", UnderlayLink, "netns", p.B.Netns).CombinedOutput(); err != nil {
		return errors.Errorf("cannot make the underlay between %s and %s: %v: %s", p.A.Netns, p.B.Netns, err, out)
	}
	for i, h := range p.Hosts() {
		addr := underlayAddresses[i] + "/" + strconv.Itoa(underlayPrefix)
		for _, args := range [][]string{
			{"addr", "add", addr, "dev", UnderlayLink},
			{"link", "set", UnderlayLink, "up"},
		} {
			if out, err := exec.CommandContext(ctx, "ip", append([]string{"-n", h.Netns}, args...)...).CombinedOutput(); err != nil { //nolint:gosec // fixed arguments
				return errors.Errorf("cannot set up the underlay in %s (ip %v): %v: %s", h.Netns, args, err, out)
			}
		}
		h.TunnelAddress = underlayAddresses[i]
	}
	return nil
}

// UnderlayMTU is the MTU of the host's end of the underlay.
func (h *Host) UnderlayMTU(ctx context.Context) (int, error) { return h.linkMTU(ctx, UnderlayLink) }

// linkMTU is the MTU of the host's link.
func (h *Host) linkMTU(ctx context.Context, link string) (int, error) {
	out, err := h.Command(ctx, "cat", "/sys/class/net/"+link+"/mtu").CombinedOutput()
	if err != nil {
		return 0, errors.Errorf("cannot read the MTU of %s in %s: %v: %s", link, h.Netns, err, out)
	}
	mtu, err := strconv.Atoi(strings.TrimSpace(string(out)))
	return mtu, errors.Wrapf(err, "cannot read the MTU of %s: %q", link, out)
}

// Close stops both hosts; removing their namespaces removes the underlay.
// It removes SharedPool's directories too.
func (p *Pair) Close() {
	for _, h := range p.Hosts() {
		if h != nil {
			h.Stop()
		}
	}
	for _, dir := range p.shared {
		_ = os.RemoveAll(dir)
	}
}

// SharedPool makes one directory both hosts reach, as an NFS export would
// be, defines it as the storage pool name on each libvirtd, and returns
// it: what both hosts' QEMUs write, so open to them as an export is.
func (p *Pair) SharedPool(name string) (string, error) {
	dir, err := os.MkdirTemp("", "vf-shared-")
	if err != nil {
		return "", errors.Wrap(err, "cannot create the shared pool's directory")
	}
	p.shared = append(p.shared, dir)
	if err := os.Chmod(dir, 0o777); err != nil { //nolint:gosec // both hosts' QEMU write here, as on an NFS export
		return "", errors.Wrap(err, "cannot open the shared pool's directory to both hosts")
	}
	for _, h := range p.Hosts() {
		if err := h.DefinePool(name, dir); err != nil {
			return "", err
		}
	}
	return dir, nil
}
