package lease

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

const after = 20 * time.Second

// step is one thing that happens to a lease, and what it must be after it.
type step struct {
	// wait moves the clock on.
	wait time.Duration
	// stored, if set, is a heartbeat put that succeeded, issued ago before
	// now; resume is what Stored must answer.
	stored *time.Duration
	resume bool
	// synced is the intent watch's Synced.
	synced bool

	want State
}

func wait(d time.Duration, want State) step { return step{wait: d, want: want} }
func synced(want State) step                { return step{synced: true, want: want} }
func stored(ago time.Duration, resume bool, want State) step {
	return step{stored: &ago, resume: resume, want: want}
}

func TestLease(t *testing.T) {
	cases := map[string]struct {
		after time.Duration
		steps []step
	}{
		"HeldFromTheStart": {after: after, steps: []step{
			wait(after-time.Millisecond, Held),
		}},
		"LostWhenNoPutSucceedsForTheLease": {after: after, steps: []step{
			wait(after, Lost),
		}},
		"EachStoredHeartbeatExtendsIt": {after: after, steps: []step{
			wait(after/2, Held),
			stored(0, false, Held),
			wait(after-time.Millisecond, Held),
			wait(time.Millisecond, Lost),
		}},
		"CountsFromWhenThePutWasIssuedNotWhenItSucceeded": {after: after, steps: []step{
			wait(after/2, Held),
			stored(after/2, false, Held), // issued when the lease began: extends nothing
			wait(after/2, Lost),
		}},
		"AnOlderPutSucceedingLateDoesNotShortenIt": {after: after, steps: []step{
			wait(after/2, Held),
			stored(0, false, Held),
			stored(after/2, false, Held),
			wait(after-time.Millisecond, Held),
		}},
		"APutAfterTheLeaseRanOutIsNotEnough": {after: after, steps: []step{
			wait(after, Lost),
			stored(0, true, Renewed),
			wait(time.Second, Renewed),
		}},
		"APutThenASyncHoldsItAgain": {after: after, steps: []step{
			wait(after, Lost),
			stored(0, true, Renewed),
			synced(Held),
			wait(after-time.Millisecond, Held),
		}},
		"ASyncBeforeThePutDoesNotCount": {after: after, steps: []step{
			wait(after, Lost),
			synced(Lost),
			stored(0, true, Renewed),
		}},
		"OnlyTheFirstPutAsksForAResume": {after: after, steps: []step{
			wait(after, Lost),
			stored(0, true, Renewed),
			wait(time.Second, Renewed),
			stored(0, false, Renewed),
		}},
		"APutThatTookLongerThanTheLeaseRenewsNothing": {after: after, steps: []step{
			wait(2*after, Lost),
			stored(after, false, Lost),
			synced(Lost),
		}},
		"LostAgainWhileWaitingForTheSync": {after: after, steps: []step{
			wait(after, Lost),
			stored(0, true, Renewed),
			wait(after, Lost),
			synced(Lost),
			stored(0, true, Renewed),
			synced(Held),
		}},
		"ASyncWhileHeldChangesNothing": {after: after, steps: []step{
			synced(Held),
			wait(after, Lost),
		}},
		"ZeroNeverFences": {after: 0, steps: []step{
			wait(24*time.Hour, Held),
			stored(0, false, Held),
			wait(24*time.Hour, Held),
		}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			now := time.Date(2026, 11, 3, 10, 0, 0, 0, time.UTC)
			l := New(tc.after, func() time.Time { return now })
			for i, s := range tc.steps {
				now = now.Add(s.wait)
				if s.stored != nil {
					assert.Equal(t, s.resume, l.Stored(now.Add(-*s.stored)), "step %d: Stored asks for a resume", i)
				}
				if s.synced {
					l.Synced()
				}
				assert.Equal(t, s.want, l.State(), "step %d", i)
				assert.Equal(t, s.want != Held, l.Fenced(), "step %d: Fenced", i)
			}
		})
	}
}

func TestNilLeaseIsNeverFenced(t *testing.T) {
	var l *Lease
	assert.False(t, l.Fenced())
}

func TestCheckEvery(t *testing.T) {
	assert.Equal(t, 250*time.Millisecond, New(20*time.Second, nil).CheckEvery(), "at most every 250 ms")
	assert.Equal(t, 100*time.Millisecond, New(2*time.Second, nil).CheckEvery(), "a twentieth of a short lease")
}
