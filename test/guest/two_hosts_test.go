package guest

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/harness/guesthost"
	"github.com/virtfleet/virtfleet/internal/harness/guestimage"
	"github.com/virtfleet/virtfleet/internal/harness/stack"
)

// The two hypervisors of TestTwoHostsOneNetwork.
const (
	nodeA = "hv-a"
	nodeB = "hv-b"
)

// vxlanOverhead is what VXLAN over IPv4 adds to each frame: the outer IPv4,
// UDP and VXLAN headers and the inner Ethernet header.
const vxlanOverhead = 50

// reachTimeout bounds how long a guest may take to reach an address over
// the overlay once both ends run (neighbour discovery, the overlay's
// forwarding entries).
const reachTimeout = 2 * time.Minute

// One VirtualNetwork across two hypervisors: a guest on each host, joined
// by the network's overlay over the hosts' underlay, reach each other at
// the addresses their status shows and the network's gateway on their own
// host, with an MTU that leaves room for the encapsulation; a restarted
// guest keeps its address.
func TestTwoHostsOneNetwork(t *testing.T) {
	t.Parallel() // beside TestRealGuest
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Minute)
	defer cancel()
	image := ensureImage(ctx, t)
	suiteStart := time.Now()

	pair, err := guesthost.StartPair(ctx, "vfpair", os.Stderr)
	require.NoError(t, err)
	t.Cleanup(pair.Close)
	shared, err := pair.SharedPool(sharedPoolName)
	require.NoError(t, err)
	g := startSuite(ctx, t, image, map[string]*guesthost.Host{nodeA: pair.A, nodeB: pair.B}, func(o *stack.Options) {
		o.SharedPool, o.FenceAfter, o.FencingMargin = sharedPoolName, haFenceAfter, haMargin
		o.ObjectStore = true
	})
	a, b := g.on(nodeA), g.on(nodeB)

	// Both are created before either is waited for, so they boot at once,
	// under one hold of the machine's boot lock.
	booted := guestimage.HoldBoot(ctx, t)
	created := time.Now()
	for name, node := range map[string]string{"g1": nodeA, "g2": nodeB} {
		v := vm(name, g.pub, 1)
		meta.AddAnnotations(v, map[string]string{v1alpha1.AnnotationNode: node})
		g.create(v)
	}
	var ipA, ipB string
	if !t.Run("EachRunsOnItsHostWithAnAddressOfItsOwn", func(t *testing.T) {
		var v *v1alpha1.VirtualMachine
		v, ipA = a.waitRunningWithAddress(t, "g1", created)
		assert.Equal(t, nodeA, v.Status.AtProvider.Node)
		v, ipB = b.waitRunningWithAddress(t, "g2", created)
		assert.Equal(t, nodeB, v.Status.AtProvider.Node)
		require.NotEqual(t, ipA, ipB, "one network, one address per interface")
		a.installPing(t, ipA)
		b.installPing(t, ipB)
	}) {
		return // every later step needs both guests running
	}
	booted()

	t.Run("AReachesBAcrossTheHosts", func(t *testing.T) {
		a.sshUntil(t, ipA, ping(ipB, defaultPayload), reachTimeout)
		b.sshUntil(t, ipB, ping(ipA, defaultPayload), reachTimeout)
	})
	t.Run("BothReachTheGatewayOnTheirHost", func(t *testing.T) {
		gateway := netip.MustParsePrefix(netCIDR).Masked().Addr().Next().String()
		a.sshUntil(t, ipA, ping(gateway, defaultPayload), reachTimeout)
		b.sshUntil(t, ipB, ping(gateway, defaultPayload), reachTimeout)
	})
	t.Run("GuestMTUIsTheUnderlaysLessVXLAN", func(t *testing.T) {
		for _, c := range []struct {
			g        *suite
			ip, peer string
		}{{a, ipA, ipB}, {b, ipB, ipA}} {
			underlay, err := c.g.host.UnderlayMTU(ctx)
			require.NoError(t, err)
			want := underlay - vxlanOverhead
			mtu := c.g.sshUntil(t, c.ip, fmt.Sprintf(`cat /sys/class/net/$(ip -o -4 addr show to %s | awk '{print $2}')/mtu`, c.ip), time.Minute)
			assert.Equal(t, strconv.Itoa(want), mtu, "the MTU of %s's interface", c.ip)
			// A packet of the whole MTU, never fragmented, crosses both
			// ways: the number is the one the overlay carries.
			c.g.sshUntil(t, c.ip, ping(c.peer, want-ipv4ICMPHeaders), reachTimeout)
		}
	})
	t.Run("BKeepsItsAddressAcrossARestart", booting(ctx, func(t *testing.T) {
		b.restart(t, "g2", b.facts(t, ipB).bootID, 1)
		assert.Equal(t, ipB, address(b.get(t, "g2")), "the address is the VM's, not the boot's")
		addrs := b.sshUntil(t, ipB, "ip -4 -o addr show scope global", bootTimeout)
		assert.Contains(t, addrs, " "+ipB+"/", "the guest holds it again")
		a.sshUntil(t, ipA, ping(ipB, defaultPayload), reachTimeout)
	}))
	// Before the snapshot, which drops the VM's checkpoints.
	var backup backedUp
	backedUpTwice := t.Run("ABackupReadsOnlyWhatChangedSinceTheLast", func(t *testing.T) {
		backup = a.backUpTwice(t, "g1", ipA)
	})
	var g2Full *v1alpha1.VirtualMachineBackup
	t.Run("ASecondVMFromTheSameImageAddsLittleToTheStore", func(t *testing.T) {
		if backup.fullWritten == 0 {
			t.Skip("needs the full backup of the step before")
		}
		g2Full = b.backUpAlike(t, "g2", backup)
	})
	t.Run("AnAgentKilledMidBackupFailsItAndTheNextTwoRestore", booting(ctx, func(t *testing.T) {
		if g2Full == nil {
			t.Skip("needs the VM's backup of the step before")
		}
		held := b.killedMidBackup(t, "g2", ipB, nodeB, g2Full)
		b.restoredAsHeld(t, nodeB, held)
	}))
	t.Run("ACloneThroughABackupRunsOnTheOtherHostWhileItsSourceRuns", booting(ctx, func(t *testing.T) {
		g.cloneElsewhere(t, "g1", ipA, nodeA, nodeB)
	}))
	t.Run("AFrozenSnapshotKeepsTheGuestFromMovingUntilDeleted", func(t *testing.T) {
		g.snapshotHoldsTheGuest(t, "g1", ipA, nodeA, ipB, nodeB)
	})
	// Reshaped live, then moved: the target runs the guest as it is now,
	// not as it booted.
	var resized *shape
	t.Run("VCPUsAndMemoryChangeLiveBeforeTheMove", func(t *testing.T) {
		s := a.resize(t, "g1", a.facts(t, ipA).bootID, 2, resource.MustParse("1536Mi"))
		resized = &s
	})
	moved := t.Run("ALiveMigrationMovesAGuestWithItsVolumeAndAddress", func(t *testing.T) {
		g.migrate(t, "g1", ipA, nodeA, nodeB, ipB)
		b.sshUntil(t, ipB, ping(ipA, defaultPayload), reachTimeout)
		if resized != nil {
			assert.Equal(t, *resized, b.shape(t, ipA), "the vCPUs and memory given live before the move")
		}
	})
	t.Run("AVMIsBackedUpOnTheNodeItMovedTo", func(t *testing.T) {
		if !moved {
			t.Skip("needs the migration of the step before")
		}
		b.backedUpAfterTheMove(t, "g1", ipA, nodeB)
	})
	t.Run("ADrainMovesEveryVMOffItsNode", func(t *testing.T) {
		g.drain(t, nodeB, nodeA, map[string]string{"g1": ipA, "g2": ipB})
	})
	// Last: host A is lost for good.
	t.Run("AGuestOnASharedDiskRunsOnAfterItsHostDies", booting(ctx, func(t *testing.T) {
		g.failover(t, pair, image, shared)
	}))
	t.Run("ABackupIsMadeAgainOnTheOtherHostOnceItsHostIsGone", booting(ctx, func(t *testing.T) {
		if !backedUpTwice {
			t.Skip("needs the backups of the step before")
		}
		g.madeAgain(t, backup, nodeB)
	}))
	t.Logf("suite took %s", time.Since(suiteStart).Round(time.Second))
}

// Payload sizes for ping: ping's own default, and the IPv4 and ICMP echo
// headers a packet of the whole MTU has besides its payload.
const (
	defaultPayload  = 56
	ipv4ICMPHeaders = 20 + 8
)

// pingScript is ping for a guest image that has none (python3 is there for
// cloud-init): ICMP echo requests from a raw socket, so it runs as root,
// with "don't fragment" set, so that a reply to a packet as large as the
// interface's MTU proves the path carries such packets both ways. It takes
// the address and the payload's size, and fails unless an echo reply of the
// same size comes back.
const pingScript = icmpPrelude + `for seq in range(10):
    body = echo(seq, size)
    s.sendto(body, (dst, 0))
    end = time.time() + 1
    while time.time() < end:
        try:
            d, src = s.recvfrom(65535)
        except socket.timeout:
            break
        h = (d[0] & 15) * 4
        if src[0] == dst and d[h] == 0 and d[h+4:h+8] == body[4:8] and len(d) - h == len(body):
            sys.exit(0)
sys.exit("no echo reply of %d bytes from %s" % (len(body), dst))
`

// icmpPrelude is what pingScript and pingStreamScript share: a raw ICMP
// socket with "don't fragment" set, and echo(seq, size), an echo request
// with its checksum.
const icmpPrelude = `#!/usr/bin/python3
import os, socket, struct, sys, time
dst, size = sys.argv[1], int(sys.argv[2])
s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
s.setsockopt(socket.IPPROTO_IP, 10, 2)  # IP_MTU_DISCOVER: IP_PMTUDISC_DO
s.settimeout(1)
ident = os.getpid() & 0xffff
def checksum(b):
    b += b"\0" * (len(b) % 2)
    t = sum(struct.unpack("!%dH" % (len(b) // 2), b))
    t = (t >> 16) + (t & 0xffff)
    t += t >> 16
    return ~t & 0xffff
def echo(seq, size):
    body = struct.pack("!BBHHH", 8, 0, 0, ident, seq & 0xffff) + b"v" * size
    return body[:2] + struct.pack("!H", checksum(body)) + body[4:]
`

// pingStreamScript sends an echo request every 200 ms until it is killed
// and prints the sequence number of each reply as it comes.
const pingStreamScript = icmpPrelude + `s.settimeout(0.05)
seq = 0
while True:
    body = echo(seq, size)
    s.sendto(body, (dst, 0))
    end = time.time() + 0.2
    while time.time() < end:
        try:
            d, src = s.recvfrom(65535)
        except socket.timeout:
            continue
        h = (d[0] & 15) * 4
        if src[0] == dst and d[h] == 0 and d[h+4:h+6] == body[4:6]:
            print(struct.unpack("!H", d[h+6:h+8])[0], flush=True)
    seq += 1
`

// Where installPing puts pingScript and pingStreamScript in a guest.
const (
	pingPath       = "/usr/local/bin/vfping"
	pingStreamPath = "/usr/local/bin/vfpingstream"
)

// installPing puts pingScript and pingStreamScript into the guest at ip,
// once, so that each ping is a short command (and its failure a short
// message). The guest's disk keeps them across restarts.
func (g *suite) installPing(t *testing.T, ip string) {
	t.Helper()
	for path, script := range map[string]string{pingPath: pingScript, pingStreamPath: pingStreamScript} {
		b64 := base64.StdEncoding.EncodeToString([]byte(script))
		g.sshUntil(t, ip, fmt.Sprintf("echo %s | base64 -d | sudo tee %s >/dev/null && sudo chmod 755 %s", b64, path, path), 3*time.Minute)
	}
}

// ping is the command that pings ip from inside a guest with a payload of
// size bytes.
func ping(ip string, size int) string {
	return fmt.Sprintf("sudo %s %s %d", pingPath, ip, size)
}
