// Package freeport picks TCP ports on 127.0.0.1 for the servers a test
// starts and must name before they bind (on their command lines, in
// their configuration).
//
// A port the kernel gives for port 0 comes from its ephemeral range
// (net.ipv4.ip_local_port_range), which every outgoing connection and every
// other listener on port 0 of the machine draws from too: between the pick
// and the server's bind, another process can be given the same port, and
// the server fails with "address already in use" (test packages run in
// parallel, each starting dozens of servers and connections). Ports here
// come from outside that range, where the kernel gives out none, at random,
// and each is reserved for the process that picked it (see reserve), so
// that two test processes picking at the same time never take the same
// one: a test cloud names its services' ports minutes before the last of
// them binds.
package freeport

import (
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
)

const (
	// lowest is the lowest port picked: above the well-known ports and
	// the registered ones services commonly listen on.
	lowest = 10000
	// minPorts is the fewest ports a range outside the ephemeral one must
	// hold to be picked from.
	minPorts = 1000
	// tries is how many random ports Pick tries before it gives up.
	tries = 100
)

// rangeFile holds the kernel's ephemeral range: its lowest and highest port.
const rangeFile = "/proc/sys/net/ipv4/ip_local_port_range"

// reservations is the directory of the ports' lock files (see reserve).
var reservations = filepath.Join(os.TempDir(), "virtfleet-ports")

var (
	mu sync.Mutex
	// picked are the ports this process was given, with their
	// reservations: each is free when picked, and stays free until its
	// server binds it.
	picked = map[int]*os.File{}
)

// Pick returns a port on 127.0.0.1 that is free now and outside the
// kernel's ephemeral range.
func Pick() (int, error) {
	lo, hi, err := pickRange()
	if err != nil {
		return 0, err
	}
	return pickIn(lo, hi)
}

// pickRange is the range [lo, hi) Pick picks from on this machine.
func pickRange() (lo, hi int, err error) {
	b, err := os.ReadFile(rangeFile)
	if err != nil {
		return 0, 0, errors.Wrap(err, "cannot read the kernel's ephemeral port range")
	}
	return outside(string(b))
}

// pickIn is Pick within [lo, hi).
func pickIn(lo, hi int) (int, error) {
	mu.Lock()
	defer mu.Unlock()
	for range tries {
		p := lo + rand.IntN(hi-lo) //nolint:gosec // spreading picks, not a secret
		if _, ok := picked[p]; ok {
			continue
		}
		lock, err := reserve(p)
		if err != nil {
			return 0, err
		}
		if lock == nil {
			continue // another process's
		}
		if !free(p) {
			_ = lock.Close()
			continue
		}
		picked[p] = lock
		return p, nil
	}
	return 0, errors.Errorf("no free port in [%d, %d) after %d tries", lo, hi, tries)
}

// reserve locks port p's file in reservations (flock) and returns it, or
// nil when another process holds it. The lock is held for as long as the
// file is open: for the life of the process that picked p, which the
// kernel ends however the process does, so a killed run's reservations
// are gone with it.
func reserve(p int) (*os.File, error) {
	if err := os.MkdirAll(reservations, 0o700); err != nil {
		return nil, errors.Wrap(err, "cannot create the ports' reservations directory")
	}
	f, err := os.OpenFile(filepath.Join(reservations, strconv.Itoa(p)), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, errors.Wrapf(err, "cannot reserve port %d", p)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, nil
		}
		return nil, errors.Wrapf(err, "cannot reserve port %d", p)
	}
	return f, nil
}

// free is whether port p can be listened on now.
func free(p int) bool {
	l, err := net.Listen("tcp", address(p))
	if err != nil {
		return false
	}
	_ = l.Close()
	return true
}

// address is port p on 127.0.0.1.
func address(p int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(p)) }

// outside is the range [lo, hi) to pick from, given the kernel's ephemeral
// range as rangeFile holds it: below it if that holds minPorts from lowest
// on, else above it.
func outside(ephemeral string) (lo, hi int, err error) {
	f := strings.Fields(ephemeral)
	if len(f) != 2 {
		return 0, 0, errors.Errorf("cannot read the ephemeral port range %q: want two ports", ephemeral)
	}
	first, err1 := strconv.Atoi(f[0])
	last, err2 := strconv.Atoi(f[1])
	if err := errors.Join(err1, err2); err != nil {
		return 0, 0, errors.Wrapf(err, "cannot read the ephemeral port range %q", ephemeral)
	}
	switch {
	case first-lowest >= minPorts:
		return lowest, first, nil
	case 65535-last >= minPorts:
		return last + 1, 65536, nil
	}
	return 0, 0, errors.Errorf("the ephemeral port range %d-%d leaves fewer than %d ports outside it", first, last, minPorts)
}
