package placement

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestBookKeepsWhatAWalkOfEveryReservationWouldFind drives a book with a
// random mix of placements, re-placements, confirmations, releases,
// heartbeats and expiries, and checks after each step that what it keeps
// is what walking every reservation (the Placer before the book) finds:
// the same reservations, and the same sum reserved on each node.
func TestBookKeepsWhatAWalkOfEveryReservationWouldFind(t *testing.T) {
	const ttl = 10 * time.Second
	rng := rand.New(rand.NewPCG(1, 2)) //nolint:gosec // a reproducible test sequence
	b := newBook()
	want := map[string]reservation{}
	nodes := []string{"n1", "n2", "n3"}
	now := time.Unix(1_000_000, 0)
	for step := range 5000 {
		now = now.Add(time.Duration(rng.IntN(300)) * time.Millisecond)
		uid := fmt.Sprintf("vm-%d", rng.IntN(200))
		switch op := rng.IntN(6); op {
		case 0, 1:
			r := reservation{node: nodes[rng.IntN(len(nodes))], resources: Resources{VCPU: int64(1 + rng.IntN(4)), MemoryBytes: int64(1+rng.IntN(8)) << 20}, at: now}
			b.put(uid, r)
			want[uid] = r
		case 2:
			b.confirm(uid, now)
			if r, ok := want[uid]; ok && r.confirmedAt.IsZero() {
				r.confirmedAt = now
				want[uid] = r
			}
		case 3:
			b.remove(uid)
			delete(want, uid)
		case 4:
			n := nodes[rng.IntN(len(nodes))]
			b.dropCounted(n, now)
			for u, r := range want {
				if r.node == n && !r.confirmedAt.IsZero() && now.After(r.confirmedAt) {
					delete(want, u)
				}
			}
		case 5:
			b.expire(now, ttl)
			for u, r := range want {
				if now.Sub(r.at) > ttl {
					delete(want, u)
				}
			}
		}
		require.Equal(t, want, b.byUID, "step %d", step)
		sum := map[string]Resources{}
		for _, r := range want {
			sum[r.node] = sum[r.node].add(r.resources)
		}
		for n, s := range sum {
			if s == (Resources{}) {
				delete(sum, n)
			}
		}
		require.Equal(t, sum, b.sum, "step %d", step)
	}
}

// BenchmarkPlaceWithManyReserved places VMs one after another on 100
// nodes whose heartbeats count none of them yet, as in a burst: the cost of
// one placement must not grow with the reservations already held.
func BenchmarkPlaceWithManyReserved(b *testing.B) {
	for _, held := range []int{100, 10000} {
		b.Run(fmt.Sprintf("Reserved%d", held), func(b *testing.B) {
			now := time.Unix(1_000_000, 0)
			p := New(WithClock(func() time.Time { return now }))
			nodes := make([]Node, 100)
			for i := range nodes {
				nodes[i] = Node{Name: fmt.Sprintf("node%d", i), Capacity: Resources{VCPU: 1 << 30, MemoryBytes: 1 << 50}, LastSeen: now}
			}
			for i := range held {
				_, err := p.Place(nodes, Request{UID: fmt.Sprintf("held-%d", i), Resources: Resources{VCPU: 1, MemoryBytes: 64 << 20}})
				require.NoError(b, err)
			}
			i := 0
			for b.Loop() {
				_, err := p.Place(nodes, Request{UID: fmt.Sprintf("vm-%d", i), Resources: Resources{VCPU: 1, MemoryBytes: 64 << 20}})
				require.NoError(b, err)
				p.Release(fmt.Sprintf("vm-%d", i))
				i++
			}
		})
	}
}
