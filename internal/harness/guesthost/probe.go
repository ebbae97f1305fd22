package guesthost

import (
	"context"
	"net"
	"os"
	"sync"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
	"k8s.io/apimachinery/pkg/util/wait"
)

const (
	// pingPayload is ping's own default payload size.
	pingPayload = 56
	// protocolICMP is IPv4's protocol number of ICMP, what
	// icmp.ParseMessage takes.
	protocolICMP = 1
)

// Prober sends an ICMP echo request to one guest every interval, from a
// raw socket made in a network namespace the guest's address is reachable
// from (its host's, or a neighbour's on its network), and keeps the time
// each reply arrived: a guest that stands still answers nothing, so the
// longest gap between replies is its pause as another machine on its
// network sees it, and a request never answered is one it lost. It runs
// in the caller's process, so a reply's time is when the process read it:
// on a loaded machine that adds the process's own scheduling delay.
type Prober struct {
	dst      *net.IPAddr
	pc       *icmp.PacketConn
	id       int
	interval time.Duration

	mu sync.Mutex
	// sent is when each request was sent, answered whether its reply
	// came, by the request's place in the sequence.
	sent     []time.Time
	answered []bool
	replies  []time.Time

	stop func()
}

// StartProber starts pinging ip every interval from inside the network
// namespace at netnsPath. Stop ends it.
func StartProber(netnsPath, ip string, interval time.Duration) (*Prober, error) {
	dst := &net.IPAddr{IP: net.ParseIP(ip)}
	if dst.IP.To4() == nil {
		return nil, errors.Errorf("%q is not an IPv4 address", ip)
	}
	var pc *icmp.PacketConn
	if err := Within(netnsPath, func() (err error) {
		pc, err = icmp.ListenPacket("ip4:icmp", "0.0.0.0")
		return errors.Wrap(err, "cannot open a raw ICMP socket")
	}); err != nil {
		return nil, err
	}
	p := &Prober{dst: dst, pc: pc, id: os.Getpid() & 0xffff, interval: interval}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { p.send(ctx) })
	wg.Go(p.receive)
	p.stop = func() {
		cancel()
		_ = pc.Close()
		wg.Wait()
	}
	return p, nil
}

// Stop stops sending and receiving.
func (p *Prober) Stop() { p.stop() }

// Interval is how often the prober sends a request.
func (p *Prober) Interval() time.Duration { return p.interval }

// send sends an echo request every interval until ctx ends. A request that
// cannot be sent is one that gets no reply: the gap shows it.
func (p *Prober) send(ctx context.Context) {
	tick := time.NewTicker(p.interval)
	defer tick.Stop()
	data := make([]byte, pingPayload)
	for {
		p.mu.Lock()
		seq := len(p.sent) & 0xffff
		p.sent = append(p.sent, time.Now())
		p.answered = append(p.answered, false)
		p.mu.Unlock()
		m := icmp.Message{Type: ipv4.ICMPTypeEcho, Body: &icmp.Echo{ID: p.id, Seq: seq, Data: data}}
		if b, err := m.Marshal(nil); err == nil {
			_, _ = p.pc.WriteTo(b, p.dst)
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
func (p *Prober) receive() {
	buf := make([]byte, 1500)
	for {
		n, from, err := p.pc.ReadFrom(buf)
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
		e, ok := m.Body.(*icmp.Echo)
		if !ok || e.ID != p.id || from.String() != p.dst.String() {
			continue
		}
		p.mu.Lock()
		p.replies = append(p.replies, at)
		// The request is the latest sent whose sequence number, which
		// wraps at 16 bits, the reply carries.
		if last := len(p.sent) - 1; last >= 0 {
			if i := last - (last-e.Seq)&0xffff; i >= 0 {
				p.answered[i] = true
			}
		}
		p.mu.Unlock()
	}
}

// AnsweredAfter is whether a reply came after t.
func (p *Prober) AnsweredAfter(t time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.replies) > 0 && p.replies[len(p.replies)-1].After(t)
}

// WaitAnswer waits until a reply came after t, for at most timeout.
func (p *Prober) WaitAnswer(ctx context.Context, t time.Time, timeout time.Duration) error {
	return wait.PollUntilContextTimeout(ctx, p.interval, timeout, true, func(context.Context) (bool, error) {
		return p.AnsweredAfter(t), nil
	})
}

// Unanswered counts the requests sent in [from, to] and those of them no
// reply came for.
func (p *Prober) Unanswered(from, to time.Time) (sent, unanswered int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, at := range p.sent {
		if at.Before(from) || at.After(to) {
			continue
		}
		sent++
		if !p.answered[i] {
			unanswered++
		}
	}
	return sent, unanswered
}

// Gap is LongestGap of the replies so far.
func (p *Prober) Gap(from, to time.Time) (time.Duration, time.Time, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return LongestGap(p.replies, from, to)
}

// LongestGap is the longest time between two replies in a row, of replies
// in the order they came, of those that overlap the window [from, to], and
// the reply that ended it. ok is false unless a reply came before from and
// another after to: a pause at either edge of the window would be cut.
func LongestGap(replies []time.Time, from, to time.Time) (gap time.Duration, ended time.Time, ok bool) {
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
