package reconciler

import (
	"reflect"
	"slices"
	"time"

	"github.com/virtfleet/virtfleet/agent/driver"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
)

// A periodic resync observes every guest of the node with one driver List,
// which a backend answers in one round trip or a few. A guest that was
// settled the last time it was ensured (as its intent asks, nothing in
// flight, every interface with an address) and whose intent has not
// changed since is not ensured again when the listing shows it still so:
// Ensure would find nothing to do, at the cost of several round trips per
// guest, and the listing's observation is reported instead (a write only
// when it says something new). Anything else about it (an intent changed,
// a phase not the one asked for, a driver event, a retry) takes the full
// way through Ensure. The resync on start, on the intents' resumption and
// on the driver's request (a reconnect to the backend) ensures every
// guest.

// settled is a guest's intent as last ensured, when that left the guest
// settled, and when that Ensure returned.
type settled struct {
	intent wire.Intent
	at     time.Time
}

// listed is a guest's observation from a resync's List, and when that List
// began.
type listed struct {
	obs driver.Observation
	at  time.Time
}

// isSettled says whether obs, what ensuring in returned, shows the guest as
// in asks with nothing to wait for.
func isSettled(in wire.Intent, obs driver.Observation) bool {
	if in.ObserveOnly || in.Claim != nil || in.Migration != nil || in.Incoming != nil || in.Release {
		return false
	}
	want := driver.PhaseStopped
	switch {
	case in.Running && in.Paused:
		want = driver.PhasePaused
	case in.Running:
		want = driver.PhaseRunning
	}
	if obs.Phase != want || obs.Message != "" {
		return false
	}
	return !slices.ContainsFunc(obs.Interfaces, func(i driver.Interface) bool { return len(i.IPs) == 0 && want == driver.PhaseRunning })
}

// recordSettled remembers in as ensured at at when obs shows the guest
// settled, and forgets the guest's last settled intent otherwise.
func (r *Reconciler) recordSettled(in wire.Intent, obs driver.Observation, at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if isSettled(in, obs) {
		r.settled[in.UID] = settled{intent: in, at: at}
		return
	}
	delete(r.settled, in.UID)
}

// forgetSettled forgets uid's last settled intent: it is to take the full
// way at its next reconcile.
func (r *Reconciler) forgetSettled(uid string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.settled, uid)
	delete(r.listed, uid)
}

// keepListed keeps, of a resync's List begun at at, the observations of
// the guests that were settled before it began.
func (r *Reconciler) keepListed(guests []driver.Observation, at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, g := range guests {
		if s, ok := r.settled[g.UID]; ok && s.at.Before(at) {
			r.listed[g.UID] = listed{obs: g, at: at}
		}
	}
}

// takeListed is the observation a resync listed for in's guest, when the
// guest was settled with in when the List began and the listing shows it
// so still: then Ensure has nothing to do. It is taken once.
func (r *Reconciler) takeListed(in wire.Intent) (driver.Observation, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	l, ok := r.listed[in.UID]
	delete(r.listed, in.UID)
	s, known := r.settled[in.UID]
	if !ok || !known || !s.at.Before(l.at) || !reflect.DeepEqual(s.intent, in) || !isSettled(in, l.obs) {
		return driver.Observation{}, false
	}
	return l.obs, true
}
