// Package memlimit gives a command's Go runtime a soft memory limit below
// its container's hard one. The collector then works to keep the process
// under the soft limit rather than letting the heap grow into the hard
// one, where the kernel kills it. cluster/deploy hands each container its
// own limit (the downward API's limits.memory) through --memory-limit.
package memlimit

import (
	"flag"
	"fmt"
	"runtime/debug"

	"github.com/virtfleet/virtfleet/internal/flagenv"
)

// Share is the part of the container's limit the Go runtime is given. The
// rest is for memory the collector's limit leaves out or cannot hold to at
// once: pages not yet returned to the kernel, and the heap's overshoot
// while the collector catches up under load, which it bounds by using at
// most half the CPU. Go's GC guide suggests leaving 5-10%.
const Share = 0.9

// FlagName is the flag Flag defines: cluster/deploy sets it through its
// variable (flagenv.Name).
const FlagName = "memory-limit"

// Flag defines --memory-limit on fs.
func Flag(fs *flag.FlagSet) *int64 {
	return fs.Int64(FlagName, 0, fmt.Sprintf("The container's memory limit in bytes: the Go runtime keeps to %.0f%% of it, the rest left for what its collector cannot hold back. 0 leaves the runtime's own limit (GOMEMLIMIT, or none).", Share*100))
}

// Apply gives the runtime Share of limit as its soft limit and returns it;
// with limit 0, or GOMEMLIMIT set in the environment lookup reads, which
// is an operator's explicit choice, it changes nothing and returns 0.
func Apply(limit int64, lookup flagenv.Lookup) int64 {
	if _, set := lookup("GOMEMLIMIT"); set || limit <= 0 {
		return 0
	}
	soft := int64(float64(limit) * Share)
	debug.SetMemoryLimit(soft)
	return soft
}
