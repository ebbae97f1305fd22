package libvirt

import (
	"sync"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"
)

// echoTTL bounds how long an expected echo is waited for: an event lost
// with a broken connection must not swallow a later one of the same kind.
const echoTTL = 30 * time.Second

// echoes are the lifecycle events the driver's own calls cause, as
// Kubernetes controllers keep expectations of their own writes. Ensure
// defines and starts a guest and observes the result; the DEFINED and
// STARTED events that follow are that same change coming back, and passing
// them on as hints would have the reconciler ensure every new guest a
// second time (BenchmarkIntentToRunning counts Ensure calls per VM). An
// echo still updates what the driver keeps (definitions, start times); it
// is only not passed on. Expected before the call, since libvirt may send
// the event before it answers; withdrawn when the call fails.
type echoes struct {
	mu      sync.Mutex
	pending map[echo]time.Time // until when it is expected
}

type echo struct {
	key   string // domain UUID
	event golibvirt.DomainEventType
}

func newEchoes() *echoes { return &echoes{pending: map[echo]time.Time{}} }

// expect records that the domain key is about to send event because of a
// call of the driver's own.
func (e *echoes) expect(key string, event golibvirt.DomainEventType, now time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.pending[echo{key, event}] = now.Add(echoTTL)
}

// withdraw forgets an expectation whose call failed.
func (e *echoes) withdraw(key string, event golibvirt.DomainEventType) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.pending, echo{key, event})
}

// heard reports whether an event of domain key is an expected echo, and
// stops expecting it.
func (e *echoes) heard(key string, event golibvirt.DomainEventType, now time.Time) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	for k, until := range e.pending {
		if now.After(until) {
			delete(e.pending, k)
		}
	}
	k := echo{key, event}
	if _, ok := e.pending[k]; !ok {
		return false
	}
	delete(e.pending, k)
	return true
}

// reset forgets every expectation: a new connection hears nothing of the
// old one's calls.
func (e *echoes) reset() {
	e.mu.Lock()
	defer e.mu.Unlock()
	clear(e.pending)
}
