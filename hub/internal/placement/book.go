package placement

import (
	"container/heap"
	"time"
)

// book holds the Placer's reservations so that placing one VM costs the
// same with ten thousand reserved as with ten: the sum reserved on each node
// is kept as reservations come and go, those confirmed on a node wait in a
// heap by when they were confirmed, for that node's next heartbeat to drop
// them, and all of them wait in a queue by when they were made, for their
// TTL. A Placer walking every reservation at each placement made a burst
// cost the square of its size.
//
// Entries of the heap and the queue are checked against byUID when they
// come out: one whose reservation went or changed meanwhile is skipped.
type book struct {
	byUID map[string]reservation
	sum   map[string]Resources
	// groups are the nodes of each placement group's reservations, by
	// uid.
	groups map[string]map[string]string
	// confirmed are each node's confirmed reservations, earliest first.
	confirmed map[string]*stamps
	// made are every reservation, earliest first; reservations are made in
	// the order of the Placer's clock, so appending keeps it sorted.
	made []stamp
}

// stamp is a reservation's uid and one of its times.
type stamp struct {
	uid string
	at  time.Time
}

func newBook() *book {
	return &book{byUID: map[string]reservation{}, sum: map[string]Resources{}, groups: map[string]map[string]string{}, confirmed: map[string]*stamps{}}
}

func (b *book) get(uid string) (reservation, bool) {
	r, ok := b.byUID[uid]
	return r, ok
}

// put makes r the reservation of uid, in place of any it had.
func (b *book) put(uid string, r reservation) {
	b.remove(uid)
	b.byUID[uid] = r
	b.sum[r.node] = b.sum[r.node].add(r.resources)
	if r.group != "" {
		if b.groups[r.group] == nil {
			b.groups[r.group] = map[string]string{}
		}
		b.groups[r.group][uid] = r.node
	}
	b.made = append(b.made, stamp{uid: uid, at: r.at})
	if !r.confirmedAt.IsZero() {
		b.pushConfirmed(uid, r)
	}
}

// remove drops the reservation of uid, if any.
func (b *book) remove(uid string) {
	r, ok := b.byUID[uid]
	if !ok {
		return
	}
	delete(b.byUID, uid)
	if g := b.groups[r.group]; g != nil {
		delete(g, uid)
		if len(g) == 0 {
			delete(b.groups, r.group)
		}
	}
	s := b.sum[r.node].add(Resources{VCPU: -r.resources.VCPU, MemoryBytes: -r.resources.MemoryBytes})
	if s == (Resources{}) {
		delete(b.sum, r.node)
	} else {
		b.sum[r.node] = s
	}
}

// groupMembers are the nodes of group's reservations, by uid; the caller
// only reads them.
func (b *book) groupMembers(group string) map[string]string {
	return b.groups[group]
}

// confirm records that uid's guest was reported at, once.
func (b *book) confirm(uid string, at time.Time) {
	r, ok := b.byUID[uid]
	if !ok || !r.confirmedAt.IsZero() {
		return
	}
	r.confirmedAt = at
	b.byUID[uid] = r
	b.pushConfirmed(uid, r)
}

func (b *book) pushConfirmed(uid string, r reservation) {
	h := b.confirmed[r.node]
	if h == nil {
		h = &stamps{}
		b.confirmed[r.node] = h
	}
	heap.Push(h, stamp{uid: uid, at: r.confirmedAt})
}

// dropCounted drops node's reservations confirmed before its heartbeat
// of lastSeen, which counts their guests itself.
func (b *book) dropCounted(node string, lastSeen time.Time) {
	h := b.confirmed[node]
	for h != nil && h.Len() > 0 && lastSeen.After((*h)[0].at) {
		s := heap.Pop(h).(stamp) //nolint:forcetypeassert // stamps holds only stamps
		if r, ok := b.byUID[s.uid]; ok && r.node == node && r.confirmedAt.Equal(s.at) {
			b.remove(s.uid)
		}
	}
	if h != nil && h.Len() == 0 {
		delete(b.confirmed, node)
	}
}

// expire drops the reservations made more than ttl before now.
func (b *book) expire(now time.Time, ttl time.Duration) {
	i := 0
	for ; i < len(b.made) && now.Sub(b.made[i].at) > ttl; i++ {
		s := b.made[i]
		if r, ok := b.byUID[s.uid]; ok && r.at.Equal(s.at) {
			b.remove(s.uid)
		}
	}
	b.made = b.made[i:]
}

// stamps is a min-heap of stamps by time (container/heap).
type stamps []stamp

func (h stamps) Len() int           { return len(h) }
func (h stamps) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h stamps) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *stamps) Push(x any)        { *h = append(*h, x.(stamp)) } //nolint:forcetypeassert // heap.Push is given stamps only
func (h *stamps) Pop() any {
	old := *h
	s := old[len(old)-1]
	*h = old[:len(old)-1]
	return s
}
