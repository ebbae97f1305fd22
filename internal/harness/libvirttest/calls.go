package libvirttest

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

// rpcCall is the type of a libvirt RPC message that asks for a reply
// (VIR_NET_CALL); stream data and replies are not calls.
const rpcCall = 0

// CallCounter is a unix socket in front of a node's daemon that counts the
// libvirt RPC calls its clients make, by procedure number: a round trip each,
// which is what a driver's operation costs the agent and the daemon in
// syscalls and wakeups. A test holds an operation to a budget with it.
type CallCounter struct {
	// Socket is the path clients dial instead of the node's.
	Socket string

	mu    sync.Mutex
	calls map[uint32]int
}

// CountCalls starts a counter in front of the node, closed when the test ends.
func (n *Node) CountCalls(t testing.TB) *CallCounter {
	t.Helper()
	dir, err := os.MkdirTemp("", "vf-calls-")
	if err != nil {
		t.Fatalf("cannot create the counter's directory: %v", err)
	}
	c := &CallCounter{Socket: filepath.Join(dir, "sock"), calls: map[uint32]int{}}
	l, err := net.Listen("unix", c.Socket)
	if err != nil {
		t.Fatalf("cannot listen on %s: %v", c.Socket, err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		_ = l.Close()
		wg.Wait()
		_ = os.RemoveAll(dir)
	})
	wg.Go(func() {
		for {
			client, err := l.Accept()
			if err != nil {
				return
			}
			daemon, err := net.Dial("unix", n.Socket)
			if err != nil {
				_ = client.Close()
				continue
			}
			go func() {
				_, _ = io.Copy(client, daemon)
				_ = client.Close()
			}()
			go func() {
				_ = c.count(client, daemon)
				_ = daemon.Close()
			}()
		}
	})
	return c
}

// count copies the client's messages to the daemon, counting its calls. A
// message is a 4-byte big-endian length (itself included), then a header of
// program, version, procedure, type, serial and status, each 4 bytes.
func (c *CallCounter) count(client io.Reader, daemon io.Writer) error {
	var head [28]byte
	for {
		if _, err := io.ReadFull(client, head[:]); err != nil {
			return err
		}
		size := binary.BigEndian.Uint32(head[0:4])
		if size < uint32(len(head)) {
			return errors.New("short libvirt message")
		}
		if binary.BigEndian.Uint32(head[16:20]) == rpcCall {
			c.mu.Lock()
			c.calls[binary.BigEndian.Uint32(head[12:16])]++
			c.mu.Unlock()
		}
		if _, err := daemon.Write(head[:]); err != nil {
			return err
		}
		if _, err := io.CopyN(daemon, client, int64(size)-int64(len(head))); err != nil {
			return err
		}
	}
}

// Total is the number of calls counted since the last Reset.
func (c *CallCounter) Total() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, v := range c.calls {
		n += v
	}
	return n
}

// Calls is the number of calls of procedure proc (remote_protocol.x's
// REMOTE_PROC_* value) counted since the last Reset.
func (c *CallCounter) Calls(proc uint32) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls[proc]
}

// Reset forgets the calls counted so far.
func (c *CallCounter) Reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.calls)
}

// String lists the calls by procedure number (remote_protocol.x's
// REMOTE_PROC_* values), for failure messages.
func (c *CallCounter) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var parts []string
	for _, p := range slices.Sorted(maps.Keys(c.calls)) {
		parts = append(parts, fmt.Sprintf("proc %d ×%d", p, c.calls[p]))
	}
	return strings.Join(parts, ", ")
}
