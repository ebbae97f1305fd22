package fake

import (
	"bytes"
	"context"
	"io"
	"sync"

	"github.com/virtfleet/virtfleet/agent/driver"
)

var _ driver.Consoler = (*Driver)(nil)

// RFBVersion is what a VNC session of the fake reads first: an RFB
// server's ProtocolVersion. Nothing follows it.
const RFBVersion = "RFB 003.008\n"

// LoginPrompt is what a serial session of the fake reads when it opens,
// and again for every "\r" or "\n" written to it: a getty's prompt for the
// guest's host name, the VM's name.
func LoginPrompt(name string) string { return "\r\n" + name + " login: " }

// OpenConsole implements driver.Consoler with in-memory consoles of a
// running guest: its serial console behaves like a getty waiting for a
// login (LoginPrompt), its VNC display sends RFBVersion and ignores what
// it is sent. Like a real backend's, each console serves one session at a
// time: a second is refused until the first is closed.
func (d *Driver) OpenConsole(_ context.Context, uid string, kind driver.ConsoleKind) (io.ReadWriteCloser, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	g, ok := d.guests[uid]
	switch {
	case !ok:
		return nil, driver.NotFoundf("guest %s not found", uid)
	case kind != driver.ConsoleSerial && kind != driver.ConsoleVNC:
		return nil, driver.Terminalf("no console of kind %q: a guest has a %s console and a %s display", kind, driver.ConsoleSerial, driver.ConsoleVNC)
	case g.obs.Phase != driver.PhaseRunning && g.obs.Phase != driver.PhasePaused:
		return nil, driver.Terminalf("guest %s is %s: its consoles are there only while it runs", uid, g.obs.Phase)
	}
	key := console{uid: uid, kind: kind}
	if d.consoles[key] {
		return nil, driver.Terminalf("%s console is in use by another session: guest %s serves one at a time", kind, uid)
	}
	if d.consoles == nil {
		d.consoles = map[console]bool{}
	}
	d.consoles[key] = true
	release := func() {
		d.mu.Lock()
		delete(d.consoles, key)
		d.mu.Unlock()
	}
	name := g.machine.Name
	if kind == driver.ConsoleVNC {
		return newStream(RFBVersion, func([]byte) []byte { return nil }, release), nil
	}
	prompt := LoginPrompt(name)
	return newStream(prompt, func(in []byte) []byte {
		var out []byte
		for _, b := range in {
			if b == '\r' || b == '\n' {
				out = append(out, prompt...)
			}
		}
		return out
	}, release), nil
}

// console is one console of one guest.
type console struct {
	uid  string
	kind driver.ConsoleKind
}

// stream is an in-memory console session. What the guest side writes
// waits in out until it is read; what is written to the stream is answered
// at once, so a writer never waits for a reader.
type stream struct {
	mu     sync.Mutex
	ready  *sync.Cond
	out    bytes.Buffer
	closed bool
	// answer is what the guest side writes back to what it is sent.
	answer  func(in []byte) []byte
	release func()
}

func newStream(greeting string, answer func([]byte) []byte, release func()) *stream {
	s := &stream{answer: answer, release: release}
	s.ready = sync.NewCond(&s.mu)
	s.out.WriteString(greeting)
	return s
}

// Read reads what the guest side wrote, waiting for it when there is
// none. It fails with io.ErrClosedPipe once the stream is closed.
func (s *stream) Read(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for s.out.Len() == 0 && !s.closed {
		s.ready.Wait()
	}
	if s.closed {
		return 0, io.ErrClosedPipe
	}
	return s.out.Read(p)
}

// Write sends p to the guest side.
func (s *stream) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0, io.ErrClosedPipe
	}
	if out := s.answer(p); len(out) > 0 {
		s.out.Write(out)
		s.ready.Broadcast()
	}
	return len(p), nil
}

// Close ends the session and frees the console; a Read waiting returns.
func (s *stream) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed {
		s.closed = true
		s.ready.Broadcast()
		s.release()
	}
	return nil
}
