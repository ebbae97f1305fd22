package guesthost_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/virtfleet/virtfleet/internal/harness/guesthost"
)

// The pause is the longest gap between two replies that overlaps the
// window, wherever in it, and is known only once replies came on both
// sides of the window.
func TestLongestGapIsThePauseInTheWindow(t *testing.T) {
	t0 := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	at := func(ms ...int) []time.Time {
		out := make([]time.Time, len(ms))
		for i, m := range ms {
			out[i] = t0.Add(time.Duration(m) * time.Millisecond)
		}
		return out
	}
	cases := map[string]struct {
		replies  []time.Time
		from, to int
		gap      time.Duration
		ended    int
		ok       bool
	}{
		"a pause inside the window": {
			replies: at(0, 10, 20, 30, 530, 540, 550), from: 15, to: 545,
			gap: 500 * time.Millisecond, ended: 530, ok: true,
		},
		"a pause that began before the window counts": {
			replies: at(0, 10, 400, 410, 420), from: 100, to: 415,
			gap: 390 * time.Millisecond, ended: 400, ok: true,
		},
		"a pause that ends after the window counts": {
			replies: at(0, 10, 20, 900), from: 5, to: 100,
			gap: 880 * time.Millisecond, ended: 900, ok: true,
		},
		"pauses outside the window do not": {
			replies: at(0, 800, 810, 820, 830, 1900), from: 805, to: 825,
			gap: 10 * time.Millisecond, ended: 810, ok: true,
		},
		"no reply after the window yet": {
			replies: at(0, 10, 20), from: 5, to: 30,
		},
		"no reply before the window": {
			replies: at(10, 20, 30), from: 5, to: 25,
		},
		"no replies": {from: 5, to: 25},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			gap, ended, ok := guesthost.LongestGap(tc.replies, t0.Add(time.Duration(tc.from)*time.Millisecond), t0.Add(time.Duration(tc.to)*time.Millisecond))
			assert.Equal(t, tc.ok, ok)
			assert.Equal(t, tc.gap, gap)
			if tc.ok {
				assert.Equal(t, t0.Add(time.Duration(tc.ended)*time.Millisecond), ended)
			}
		})
	}
}

// The prober, on a raw socket made in another network namespace, sees
// that namespace's address answer every interval, and sees it stop
// answering while the namespace's loopback is down.
func TestProberSeesAPauseInItsNamespace(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: a network namespace and a raw ICMP socket")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs ip (iproute2)")
	}
	ns := fmt.Sprintf("vfprobe-%d", os.Getpid())
	ip := func(args ...string) {
		t.Helper()
		out, err := exec.Command("ip", args...).CombinedOutput()
		require.NoError(t, err, "ip %v: %s", args, out)
	}
	ip("netns", "add", ns)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	lo := func(state string) { ip("netns", "exec", ns, "ip", "link", "set", "lo", state) }
	lo("up")

	p, err := guesthost.StartProber("/run/netns/"+ns, "127.0.0.1", 10*time.Millisecond)
	require.NoError(t, err)
	defer p.Stop()
	ctx := context.Background()
	require.NoError(t, p.WaitAnswer(ctx, time.Now(), 10*time.Second), "the namespace's loopback answers")
	answering := time.Now()
	require.NoError(t, p.WaitAnswer(ctx, answering.Add(time.Second), 10*time.Second), "and goes on answering")
	gap, _, ok := p.Gap(answering, answering.Add(time.Second))
	require.True(t, ok)
	assert.Less(t, gap, 500*time.Millisecond, "an address that answers shows no pause")
	sent, unanswered := p.Unanswered(answering, answering.Add(time.Second))
	assert.Positive(t, sent)
	assert.Zero(t, unanswered, "every request of %d was answered", sent)

	down := time.Now()
	lo("down")
	// The pause the prober is to see: loopback down this long.
	time.Sleep(300 * time.Millisecond)
	lo("up")
	up := time.Now()
	require.NoError(t, p.WaitAnswer(ctx, up, 10*time.Second), "it answers again once loopback is up")
	gap, ended, ok := p.Gap(down, up)
	require.True(t, ok)
	t.Logf("longest gap %s with loopback down for %s", gap, up.Sub(down))
	assert.GreaterOrEqual(t, gap, 300*time.Millisecond, "the pause is seen whole")
	assert.Less(t, gap, up.Sub(down)+time.Second, "and not much longer than it was")
	assert.True(t, ended.After(down.Add(300*time.Millisecond)), "the reply that ends the pause came once loopback was up again")
	sent, unanswered = p.Unanswered(down, up)
	assert.Positive(t, unanswered, "the requests sent while loopback was down (%d) are lost", sent)
}
