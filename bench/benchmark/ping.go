package benchmark

import (
	"cmp"
	"context"
	"net"
	"os"
	"sync"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/virtfleet/virtfleet/internal/harness/guesthost"
)

const (
	// pingInterval is how often the prober asks the guest for an echo:
	// the finest pause it can see.
	pingInterval = 10 * time.Millisecond
	// pingPayload is ping's own default payload size.
	pingPayload = 56
	// protocolICMP is IPv4's protocol number of ICMP, what
	// icmp.ParseMessage takes.
	protocolICMP = 1
)

// prober sends an ICMP echo request to one guest every pingInterval, from
// a raw socket made in the guest's host's network namespace (the only
// place its address is reachable from), and keeps the time each reply
// arrived: a guest that stands still answers nothing, so the longest gap
// between replies is its pause as another machine on its network sees it.
// It runs in the benchmark's own process, so a reply's time is when the
// benchmark read it: on a loaded machine that adds the process's own
// scheduling delay, which the gap before any snapshot shows.
type prober struct {
	conn *icmp.PacketConn
	dst  *net.IPAddr
	id   int

	mu      sync.Mutex
	sent    int
	replies []time.Time

	stop func()
}

// startProber starts pinging ip from inside the network namespace at
// netnsPath. stop ends it.
func startProber(netnsPath, ip string) (*prober, error) {
	dst := &net.IPAddr{IP: net.ParseIP(ip)}
	if dst.IP.To4() == nil {
		return nil, errors.Errorf("%q is not an IPv4 address", ip)
	}
	var conn *icmp.PacketConn
	if err := guesthost.Within(netnsPath, func() (err error) {
		conn, err = icmp.ListenPacket("ip4:icmp", "0.0.0.0")
		return errors.Wrap(err, "cannot open a raw ICMP socket")
	}); err != nil {
		return nil, err
	}
	p := &prober{conn: conn, dst: dst, id: os.Getpid() & 0xffff}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { p.send(ctx) })
	wg.Go(p.receive)
	p.stop = func() {
		cancel()
		_ = conn.Close()
		wg.Wait()
	}
	return p, nil
}

// send sends an echo request every pingInterval until ctx ends. A request
// that cannot be sent is one that gets no reply: the gap shows it.
func (p *prober) send(ctx context.Context) {
	tick := time.NewTicker(pingInterval)
	defer tick.Stop()
	data := make([]byte, pingPayload)
	for {
		p.mu.Lock()
		seq := p.sent & 0xffff
		p.sent++
		p.mu.Unlock()
		m := icmp.Message{Type: ipv4.ICMPTypeEcho, Body: &icmp.Echo{ID: p.id, Seq: seq, Data: data}}
		if b, err := m.Marshal(nil); err == nil {
			_, _ = p.conn.WriteTo(b, p.dst)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// receive records each echo reply of the guest to this prober until the
// socket is closed. The raw socket sees every ICMP message of the
// namespace; the others are ignored.
func (p *prober) receive() {
	buf := make([]byte, 1500)
	for {
		n, from, err := p.conn.ReadFrom(buf)
		if errors.Is(err, net.ErrClosed) {
			return
		}
		at := time.Now()
		if err != nil {
			continue
		}
		m, err := icmp.ParseMessage(protocolICMP, buf[:n])
		if err != nil || m.Type != ipv4.ICMPTypeEchoReply {
			continue
		}
		if e, ok := m.Body.(*icmp.Echo); !ok || e.ID != p.id || from.String() != p.dst.String() {
			continue
		}
		p.mu.Lock()
		p.replies = append(p.replies, at)
		p.mu.Unlock()
	}
}

// answeredAfter is whether a reply came after t.
func (p *prober) answeredAfter(t time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.replies) > 0 && p.replies[len(p.replies)-1].After(t)
}

// waitAnswer waits until a reply came after t, for at most timeout.
func (p *prober) waitAnswer(ctx context.Context, t time.Time, timeout time.Duration) error {
	return wait.PollUntilContextTimeout(ctx, pingInterval, timeout, true, func(context.Context) (bool, error) {
		return p.answeredAfter(t), nil
	})
}

// baseline waits for the guest's first answer, then returns the longest
// gap between its replies over pingBaseline: what the loaded machine's
// own noise is before anything is done to the guest. It fails when the
// guest does not answer, or stops answering; ctx's end is its error.
func (p *prober) baseline(ctx context.Context) (time.Duration, error) {
	if err := p.waitAnswer(ctx, time.Now(), answerTimeout); err != nil {
		return 0, cmp.Or(ctx.Err(), errors.Errorf("the guest did not answer the prober within %s", answerTimeout))
	}
	// The window opens once the guest answered, so a reply precedes it.
	from := time.Now()
	select {
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-time.After(pingBaseline):
	}
	to := time.Now()
	if err := p.waitAnswer(ctx, to, answerTimeout); err != nil {
		return 0, cmp.Or(ctx.Err(), errors.New("the guest stopped answering the prober"))
	}
	gap, _, _ := p.gap(from, to)
	return gap, nil
}

// gap is longestGap of the replies so far.
func (p *prober) gap(from, to time.Time) (time.Duration, time.Time, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return longestGap(p.replies, from, to)
}

// longestGap is the longest time between two replies in a row, of replies
// in the order they came, of those that overlap the window [from, to], and
// the reply that ended it. ok is false unless a reply came before from and
// another after to: a pause at either edge of the window would be cut.
func longestGap(replies []time.Time, from, to time.Time) (gap time.Duration, ended time.Time, ok bool) {
	if len(replies) == 0 || replies[0].After(from) || !replies[len(replies)-1].After(to) {
		return 0, time.Time{}, false
	}
	for i := 1; i < len(replies); i++ {
		before, after := replies[i-1], replies[i]
		if after.Before(from) {
			continue
		}
		if before.After(to) {
			break
		}
		if d := after.Sub(before); d > gap {
			gap, ended = d, after
		}
	}
	return gap, ended, true
}
