package freeport

import (
	"math/rand/v2"
	"net"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestOutside(t *testing.T) {
	for _, tc := range []struct {
		name, ephemeral string
		lo, hi          int
		err             bool
	}{
		{name: "Linux's default: below it", ephemeral: "32768\t60999\n", lo: 10000, hi: 32768},
		{name: "IANA's: below it", ephemeral: "49152 65535", lo: 10000, hi: 49152},
		{name: "starting low: above it", ephemeral: "1024 60000", lo: 60001, hi: 65536},
		{name: "all ports", ephemeral: "1024 65535", err: true},
		{name: "not two ports", ephemeral: "32768", err: true},
		{name: "not numbers", ephemeral: "low high", err: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lo, hi, err := outside(tc.ephemeral)
			if tc.err {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, [2]int{tc.lo, tc.hi}, [2]int{lo, hi})
		})
	}
}

// The ports picked are this machine's: outside its ephemeral range, free,
// and each another.
func TestPickGivesFreePortsOutsideTheEphemeralRange(t *testing.T) {
	lo, hi, err := pickRange()
	require.NoError(t, err)
	seen := map[int]bool{}
	for range 50 {
		p, err := Pick()
		require.NoError(t, err)
		require.False(t, seen[p], "port %d given twice", p)
		seen[p] = true
		require.True(t, p >= lo && p < hi, "port %d outside [%d, %d)", p, lo, hi)
		l, err := net.Listen("tcp", address(p))
		require.NoError(t, err, "port %d is not free", p)
		require.NoError(t, l.Close())
	}
}

// A port a server holds is not given: of four ports, three held, the
// fourth is (a hundred random tries miss it with a chance of 3e-13).
func TestPickPassesOverPortsInUse(t *testing.T) {
	lo, hi, err := pickRange()
	require.NoError(t, err)
	for range 20 {
		first := lo + rand.IntN(hi-lo-4) //nolint:gosec // a test's spread
		var held []net.Listener
		for p := first; p < first+3; p++ {
			if l, err := net.Listen("tcp", address(p)); err == nil {
				held = append(held, l)
			}
		}
		if len(held) < 3 || !unpicked(first+3) {
			closeAll(held)
			continue // another process holds one of them: try elsewhere
		}
		p, err := pickIn(first, first+4)
		closeAll(held)
		require.NoError(t, err)
		assert.Equal(t, first+3, p)
		return
	}
	t.Fatal("found no four ports in a row free")
}

// A port another process reserved is not given though nothing listens on
// it yet: that process picked it, and its server has yet to bind. The
// other process is played by a second open file of the port's
// reservation, whose lock conflicts with this process's as another
// process's would.
func TestPickPassesOverPortsAnotherProcessReserved(t *testing.T) {
	lo, hi, err := pickRange()
	require.NoError(t, err)
	for range 20 {
		p := lo + rand.IntN(hi-lo) //nolint:gosec // a test's spread
		if !unpicked(p) {
			continue
		}
		theirs, err := reserve(p)
		require.NoError(t, err)
		if theirs == nil {
			continue // a real other process's: try elsewhere
		}
		_, err = pickIn(p, p+1)
		require.Error(t, err, "port %d, reserved by another process, was given", p)
		require.NoError(t, theirs.Close())
		got, err := pickIn(p, p+1)
		require.NoError(t, err, "port %d, released, was not given", p)
		assert.Equal(t, p, got)
		return
	}
	t.Fatal("found no free port to reserve")
}

// unpicked is whether port p was not given before in this process and can
// be listened on now.
func unpicked(p int) bool {
	mu.Lock()
	defer mu.Unlock()
	_, given := picked[p]
	return !given && free(p)
}

func closeAll(ls []net.Listener) {
	for _, l := range ls {
		_ = l.Close()
	}
}
