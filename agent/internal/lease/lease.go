// Package lease decides when a node fences itself: when it has not stored a
// heartbeat for its lease, it must destroy the guests the hub may restart
// elsewhere (intents with Fence set) and start none of them again until it
// has heard from the hub afresh.
//
// The hub restarts a lost node's Fence guests on another node only once it
// has not received a heartbeat for the lease and a margin. The lease here
// counts from when the agent issued its last heartbeat put that succeeded,
// which is never later than when the hub received it; so the node fences
// itself no later than the lease after the hub's last receipt, and the
// margin covers the watchdog's interval and the time the backend takes to
// destroy the guests. That holds too when the node is alive but cut off (a
// partition), which a hub cannot tell from a crash.
//
// An agent that is not running cannot fence: the lease of a new agent counts
// from its start, not from its predecessor's last heartbeat. Disk locks
// (QEMU's image locks on shared storage) are the second line.
package lease

import (
	"sync"
	"time"
)

// State is where a Lease stands.
type State int

// States of a Lease.
const (
	// Held: a heartbeat was stored within the lease, and the intents were
	// read afresh since the lease was last lost. The node runs its Fence
	// guests as their intents say.
	Held State = iota
	// Lost: no heartbeat was stored for the lease. The node is fenced: its
	// Fence guests must be destroyed and none of them started.
	Lost
	// Renewed: a heartbeat was stored again after the lease was lost, but
	// the intents have not been read afresh since. The node is still
	// fenced: the hub may have moved or deleted a guest while the node was
	// cut off, which only a fresh read shows.
	Renewed
)

func (s State) String() string {
	switch s {
	case Held:
		return "Held"
	case Lost:
		return "Lost"
	case Renewed:
		return "Renewed"
	}
	return "Unknown"
}

// Lease is one node's lease. Its methods may be called from any goroutine.
//
// The order of events it needs is:
//   - Stored after each heartbeat put that succeeded, with the time taken
//     before the put was issued;
//   - Synced each time the intent watch has delivered every intent there
//     was when it started or resumed (bus.Handlers' Synced).
//
// A lost lease is held again only after Stored and then Synced: when Stored
// says so, the caller makes the intent watch resume (bus.Bus's
// ResumeIntents), so that a Synced comes that follows the renewal.
type Lease struct {
	after time.Duration
	now   func() time.Time

	mu sync.Mutex
	// stored is when the last heartbeat put that succeeded was issued.
	stored time.Time
	state  State
}

// New returns a Lease of duration after, held from now (a new agent has no
// earlier heartbeat to count from). After 0 is a lease that is never lost:
// the node does not fence itself, and its heartbeat says so, so the hub
// never restarts its guests elsewhere. now is the clock, time.Now when nil.
func New(after time.Duration, now func() time.Time) *Lease {
	if now == nil {
		now = time.Now
	}
	return &Lease{after: max(after, 0), now: now, stored: now()}
}

// After is the lease's duration; 0 means the node never fences itself.
func (l *Lease) After() time.Duration { return l.after }

// Stored records that a heartbeat put issued at issued succeeded. It
// returns true when this renews a lost lease: the caller must then have the
// intent watch resume, or no Synced ends the fence.
func (l *Lease) Stored(issued time.Time) (resume bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if issued.After(l.stored) {
		l.stored = issued
	}
	if l.update() == Lost && !l.expired() {
		l.state = Renewed
		return true
	}
	return false
}

// Synced records that the intent watch delivered every intent of the node.
// It holds a renewed lease again; it does nothing to a lost one, whose
// intents may still change once the node is reachable again.
func (l *Lease) Synced() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.update() == Renewed {
		l.state = Held
	}
}

// State is where the lease stands now. It is Lost as soon as the lease has
// run out, whether or not a watchdog looked.
func (l *Lease) State() State {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.update()
}

// Fenced reports whether the node is fenced: its lease is Lost or only
// Renewed. A nil Lease never is.
func (l *Lease) Fenced() bool { return l != nil && l.State() != Held }

// LastStored is when the last heartbeat put that succeeded was issued (or
// the lease was made).
func (l *Lease) LastStored() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.stored
}

// CheckEvery is how often a watchdog should look at the lease: often
// enough that fencing starts well within the hub's margin, a twentieth of
// the lease and at most every 250 ms.
func (l *Lease) CheckEvery() time.Duration {
	return min(250*time.Millisecond, l.after/20)
}

// update moves a lease that ran out to Lost and returns its state. l.mu must
// be held.
func (l *Lease) update() State {
	if l.expired() {
		l.state = Lost
	}
	return l.state
}

// expired is whether the lease ran out. l.mu must be held.
func (l *Lease) expired() bool {
	return l.after > 0 && l.now().Sub(l.stored) >= l.after
}
