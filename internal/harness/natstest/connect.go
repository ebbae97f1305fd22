package natstest

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/virtfleet/virtfleet/internal/natswire"
)

// AsyncErrors records the errors the server sends a connection outside any
// request, which is how a permissions violation arrives.
type AsyncErrors struct {
	mu   sync.Mutex
	errs []error
}

func (a *AsyncErrors) handle(_ *nats.Conn, _ *nats.Subscription, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.errs = append(a.errs, err)
}

// WaitForViolation reports whether a permissions violation arrives within d.
func (a *AsyncErrors) WaitForViolation(d time.Duration) bool {
	deadline := time.Now().Add(d)
	for {
		a.mu.Lock()
		for _, err := range a.errs {
			if strings.Contains(strings.ToLower(err.Error()), "permissions violation") {
				a.mu.Unlock()
				return true
			}
		}
		a.mu.Unlock()
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// connectTimeout bounds the dial of a connection and the server's first
// answer. nats.go's default, 2 s, is shorter than a test process can go
// unscheduled on a machine whose cores the parallel test packages share:
// a dial to a server that listens timed out so.
const connectTimeout = 30 * time.Second

// Connect connects to s as id, reconnecting forever, and closes the
// connection when the test ends.
func Connect(t testing.TB, s *Server, id natswire.Identity) (*nats.Conn, *AsyncErrors) {
	t.Helper()
	opts, err := id.ConnectOptions()
	if err != nil {
		t.Fatal(err)
	}
	async := &AsyncErrors{}
	opts = append(opts, nats.ErrorHandler(async.handle), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond), nats.Timeout(connectTimeout))
	nc, err := nats.Connect(s.URL(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc, async
}
