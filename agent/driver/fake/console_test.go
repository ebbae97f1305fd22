package fake

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/virtfleet/virtfleet/agent/driver"
)

// The serial console answers like a getty: its prompt on opening, and
// again for every line ended.
func TestSerialConsolePrompts(t *testing.T) {
	const prompt = "\r\nweb-1 login: "
	cases := map[string]struct {
		write string
		want  string
	}{
		"PromptsOnOpening":               {want: prompt},
		"ReturnPromptsAgain":             {write: "\r", want: prompt + prompt},
		"NewlinePromptsAgain":            {write: "\n", want: prompt + prompt},
		"ReturnNewlineIsTwoLines":        {write: "\r\n", want: prompt + prompt + prompt},
		"ALineTypedPromptsOnceItEnds":    {write: "root\r", want: prompt + prompt},
		"CharactersWithoutAnEndAreQuiet": {write: "root", want: prompt},
		"EveryLineEnded":                 {write: "a\rb\rc\r", want: prompt + prompt + prompt + prompt},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			d := New("node-a")
			_, err := d.Ensure(context.Background(), driver.Machine{UID: uid, Name: "web-1", Namespace: "team-a", VCPU: 1, MemoryBytes: 1 << 30, Running: true, Disks: []driver.Disk{{Name: "root"}}})
			require.NoError(t, err)
			c, err := d.OpenConsole(context.Background(), uid, driver.ConsoleSerial)
			require.NoError(t, err)
			defer c.Close()
			if tc.write != "" {
				n, err := c.Write([]byte(tc.write))
				require.NoError(t, err)
				assert.Equal(t, len(tc.write), n)
			}
			// A write is answered before it returns: one read has it all.
			assert.Equal(t, tc.want, readOnce(t, c))
			assert.Equal(t, prompt, LoginPrompt("web-1"))
		})
	}
}

// The display speaks RFB: its ProtocolVersion, then nothing.
func TestVNCConsoleSendsTheProtocolVersion(t *testing.T) {
	d := New("node-a")
	_, err := d.Ensure(context.Background(), driver.Machine{UID: uid, Name: "web-1", Namespace: "team-a", VCPU: 1, MemoryBytes: 1 << 30, Running: true, Disks: []driver.Disk{{Name: "root"}}})
	require.NoError(t, err)
	c, err := d.OpenConsole(context.Background(), uid, driver.ConsoleVNC)
	require.NoError(t, err)
	assert.Equal(t, "RFB 003.008\n", readExactly(t, c, len(RFBVersion)))
	_, err = c.Write([]byte("RFB 003.008\n\r\n"))
	require.NoError(t, err)

	read := make(chan error, 1)
	go func() {
		_, err := c.Read(make([]byte, 1))
		read <- err
	}()
	select {
	case err := <-read:
		t.Fatalf("nothing follows the version, yet a read returned (%v)", err)
	case <-time.After(50 * time.Millisecond):
	}
	require.NoError(t, c.Close())
	select {
	case err := <-read:
		assert.ErrorIs(t, err, io.ErrClosedPipe, "Close ends a waiting read")
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not end the waiting read")
	}
}

// OpenConsole follows driver.Consoler's contract.
func TestOpenConsoleErrors(t *testing.T) {
	ctx := context.Background()
	running := driver.Machine{UID: uid, Name: "web-1", Namespace: "team-a", VCPU: 1, MemoryBytes: 1 << 30, Running: true, Disks: []driver.Disk{{Name: "root"}}}
	cases := map[string]struct {
		setUp    func(t *testing.T, d *Driver)
		uid      string
		kind     driver.ConsoleKind
		notFound bool
		terminal string
	}{
		"NoSuchGuest": {uid: "nobody", kind: driver.ConsoleSerial, notFound: true},
		"NotRunning": {
			setUp: func(t *testing.T, d *Driver) {
				stopped := running
				stopped.Running = false
				_, err := d.Ensure(ctx, stopped)
				require.NoError(t, err)
			},
			uid: uid, kind: driver.ConsoleSerial, terminal: "only while it runs",
		},
		"NoSuchKind": {
			setUp: func(t *testing.T, d *Driver) { _, err := d.Ensure(ctx, running); require.NoError(t, err) },
			uid:   uid, kind: "spice", terminal: `no console of kind "spice"`,
		},
		"InUse": {
			setUp: func(t *testing.T, d *Driver) {
				_, err := d.Ensure(ctx, running)
				require.NoError(t, err)
				c, err := d.OpenConsole(ctx, uid, driver.ConsoleSerial)
				require.NoError(t, err)
				t.Cleanup(func() { _ = c.Close() })
			},
			uid: uid, kind: driver.ConsoleSerial, terminal: "console is in use by another session",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			d := New("node-a")
			if tc.setUp != nil {
				tc.setUp(t, d)
			}
			_, err := d.OpenConsole(ctx, tc.uid, tc.kind)
			require.Error(t, err)
			if tc.notFound {
				assert.True(t, driver.IsNotFound(err), "%v", err)
				return
			}
			assert.True(t, driver.IsTerminal(err), "%v", err)
			assert.Contains(t, err.Error(), tc.terminal)
		})
	}
}

// A console serves one session at a time; closing it frees the console,
// and other consoles, guests and drivers are apart.
func TestConsoleSessionsOneAtATime(t *testing.T) {
	ctx := context.Background()
	m := driver.Machine{UID: uid, Name: "web-1", Namespace: "team-a", VCPU: 1, MemoryBytes: 1 << 30, Running: true, Disks: []driver.Disk{{Name: "root"}}}
	d, other := New("node-a"), New("node-b")
	for _, drv := range []*Driver{d, other} {
		_, err := drv.Ensure(ctx, m)
		require.NoError(t, err)
	}
	first, err := d.OpenConsole(ctx, uid, driver.ConsoleSerial)
	require.NoError(t, err)
	_, err = d.OpenConsole(ctx, uid, driver.ConsoleSerial)
	assert.True(t, driver.IsTerminal(err), "%v", err)

	vnc, err := d.OpenConsole(ctx, uid, driver.ConsoleVNC)
	require.NoError(t, err, "the display is another console")
	require.NoError(t, vnc.Close())
	elsewhere, err := other.OpenConsole(ctx, uid, driver.ConsoleSerial)
	require.NoError(t, err, "another driver's guest")
	require.NoError(t, elsewhere.Close())

	require.NoError(t, first.Close())
	require.NoError(t, first.Close(), "closing twice is harmless")
	_, err = first.Write([]byte("\r"))
	assert.ErrorIs(t, err, io.ErrClosedPipe)
	again, err := d.OpenConsole(ctx, uid, driver.ConsoleSerial)
	require.NoError(t, err, "the closed session freed the console")
	assert.True(t, strings.HasSuffix(readExactly(t, again, len(LoginPrompt("web-1"))), "login: "), "a new session prompts afresh")
	require.NoError(t, again.Close())
}

// readOnce is what one read of r returns.
func readOnce(t *testing.T, r io.Reader) string {
	t.Helper()
	b := make([]byte, 4096)
	var n int
	done := make(chan error, 1)
	go func() {
		var err error
		n, err = r.Read(b)
		done <- err
	}()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("nothing was there to read")
	}
	return string(b[:n])
}

// readExactly reads n bytes from r, failing the test if they do not come.
func readExactly(t *testing.T, r io.Reader, n int) string {
	t.Helper()
	b := make([]byte, n)
	done := make(chan error, 1)
	go func() {
		_, err := io.ReadFull(r, b)
		done <- err
	}()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatalf("%d bytes were not there to read", n)
	}
	return string(b)
}
