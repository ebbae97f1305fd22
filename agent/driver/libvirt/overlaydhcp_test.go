package libvirt

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/net/ipv4"
	"golang.org/x/sys/unix"
)

// testDHCPStaysOnItsNode plays a guest on bridge, whose overlay floods to
// the peers over the underlay: a DHCP request it broadcasts never leaves
// through the overlay, while any other broadcast does. The guest is one
// end of a veth pair of the host's namespace, the other end a port of the
// bridge; what the overlay sends is read, encapsulated, at the underlay's
// far end, up for the test's time. The peers answer no ARP, so each gets a neighbour entry for the
// test's time, or the kernel would send them nothing but ARP requests.
// Frames go in order through one queue, so a broadcast sent after the DHCP
// request is seen after it, if it went at all.
func testDHCPStaysOnItsNode(t *testing.T, h realHost, bridge netlink.Link) {
	guest := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "vfguest", MasterIndex: bridge.Attrs().Index}, PeerName: "vfguest-end"}
	require.NoError(t, h.links.LinkAdd(guest))
	t.Cleanup(func() { _ = h.links.LinkDel(guest) })
	require.NoError(t, h.links.LinkSetUp(guest))
	end, err := h.links.LinkByName(guest.PeerName)
	require.NoError(t, err)
	require.NoError(t, h.links.LinkSetUp(end))
	require.Eventually(t, func() bool {
		l, err := h.links.LinkByName(guest.PeerName)
		return err == nil && l.Attrs().OperState == netlink.OperUp
	}, 10*time.Second, 10*time.Millisecond, "the guest's end of the pair is up")
	under, err := h.links.LinkByName(underlayName)
	require.NoError(t, err)
	for _, p := range []net.IP{peerA.AsSlice(), peerB.AsSlice()} {
		n := &netlink.Neigh{LinkIndex: under.Attrs().Index, State: netlink.NUD_PERMANENT, IP: p, HardwareAddr: net.HardwareAddr{2, 0, 0, 0, 0, p[3]}}
		require.NoError(t, h.links.NeighSet(n))
		t.Cleanup(func() { _ = h.links.NeighDel(n) })
	}
	// The underlay's far end, down until now: with it down the overlay's
	// frames are dropped as they leave, DHCP or not.
	far, err := h.links.LinkByName(underlayName + "-end")
	require.NoError(t, err)
	require.NoError(t, h.links.LinkSetUp(far))
	t.Cleanup(func() { _ = h.links.LinkSetDown(far) })

	capture := packetSocket(t, h.Netns, far.Attrs().Index)
	send := packetSocket(t, h.Netns, end.Attrs().Index)
	broadcast := func(f []byte) {
		_, err := unix.Write(send, f)
		require.NoError(t, err)
	}
	// seen reads what went over the overlay until a frame holding until
	// shows, or a second has passed, and says whether it did and whether
	// a frame holding also did before it.
	seen := func(until, also []byte) (untilSeen, alsoSeen bool) {
		buf := make([]byte, 65536)
		for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); {
			n, _, err := unix.Recvfrom(capture, buf, 0)
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
				continue
			}
			require.NoError(t, err)
			alsoSeen = alsoSeen || also != nil && bytes.Contains(buf[:n], also)
			if bytes.Contains(buf[:n], until) {
				return true, alsoSeen
			}
		}
		return false, alsoSeen
	}

	// The bridge forwards through a new port once it has listened and
	// learned (STP): until a broadcast goes over, the test has nothing to
	// judge by.
	ready := []byte("virtfleet test: a broadcast through a forwarding port")
	require.Eventually(t, func() bool {
		broadcast(broadcastUDP(t, 40000, 9, ready))
		ok, _ := seen(ready, nil)
		return ok
	}, time.Minute, 10*time.Millisecond, "no broadcast of the guest went over the overlay")

	request := []byte("virtfleet test: a DHCP request")
	after := []byte("virtfleet test: a broadcast after the DHCP request")
	broadcast(broadcastUDP(t, dhcpClientPort, dhcpServerPort, request))
	broadcast(broadcastUDP(t, 40000, 9, after))
	afterSeen, requestSeen := seen(after, request)
	require.True(t, afterSeen, "the broadcast after the DHCP request went over the overlay")
	assert.False(t, requestSeen, "the DHCP request went over the overlay")
}

// packetSocket is a raw AF_PACKET socket of every protocol bound to the
// interface index of the namespace nsName, whose reads time out after a
// second. A socket belongs to the namespace it was made in, so it is made
// by a thread moved there and back.
func packetSocket(t *testing.T, nsName string, index int) int {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	here, err := netns.Get()
	require.NoError(t, err)
	defer func() { _ = here.Close() }()
	there, err := netns.GetFromName(nsName)
	require.NoError(t, err)
	defer func() { _ = there.Close() }()
	require.NoError(t, netns.Set(there))
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, int(htons(unix.ETH_P_ALL)))
	require.NoError(t, netns.Set(here), "cannot return the test's thread to its namespace")
	require.NoError(t, err)
	t.Cleanup(func() { _ = unix.Close(fd) })
	require.NoError(t, unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: index}))
	require.NoError(t, unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 1}))
	return fd
}

// broadcastUDP is an Ethernet frame of an IPv4 UDP broadcast from 0.0.0.0,
// as a DHCP client sends before it has an address, carrying payload.
func broadcastUDP(t *testing.T, src, dst uint16, payload []byte) []byte {
	t.Helper()
	udp := binary.BigEndian.AppendUint16(nil, src)
	udp = binary.BigEndian.AppendUint16(udp, dst)
	udp = binary.BigEndian.AppendUint16(udp, uint16(8+len(payload))) //nolint:gosec // a test's short payload
	udp = append(binary.BigEndian.AppendUint16(udp, 0), payload...)  // no checksum: optional in IPv4
	ip := &ipv4.Header{Version: ipv4.Version, Len: ipv4.HeaderLen, TotalLen: ipv4.HeaderLen + len(udp), TTL: 64, Protocol: unix.IPPROTO_UDP, Src: net.IPv4zero, Dst: net.IPv4bcast}
	header, err := ip.Marshal()
	require.NoError(t, err)
	binary.BigEndian.PutUint16(header[10:], ipChecksum(header))
	frame := append(append([]byte{}, net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}...), net.HardwareAddr{0x52, 0x54, 0, 0x76, 0x66, 1}...)
	frame = binary.BigEndian.AppendUint16(frame, unix.ETH_P_IP)
	return append(append(frame, header...), udp...)
}

// ipChecksum is the Internet checksum of an IPv4 header whose checksum
// field is zero.
func ipChecksum(h []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(h); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(h[i:]))
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}

// htons is a 16-bit number in network byte order, as AF_PACKET takes
// protocols.
func htons(v uint16) uint16 { return v<<8 | v>>8 }
