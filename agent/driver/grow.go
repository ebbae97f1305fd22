package driver

import (
	"fmt"
	"strings"
	"sync"
)

// GrownDisks is how a driver grows its guests' disks in Ensure (see the
// Driver contract) without asking the backend anything at a resync: it
// remembers, per guest, the disk sizes last found in place. It is safe for
// concurrent use, and its zero value remembers nothing yet: each guest's
// disks are looked at once after the driver starts.
type GrownDisks struct {
	mu    sync.Mutex
	sizes map[string]string
}

// Grow calls grow for each disk of m that is not Imported, unless m's disk
// sizes are the ones found in place before, and joins what grow says: why
// a disk is not as big as asked yet, or nothing once it is. When every
// disk is, m's sizes are remembered; otherwise the next Grow tries again.
func (g *GrownDisks) Grow(m Machine, grow func(Disk) string) string {
	want := diskSizes(m)
	g.mu.Lock()
	done := g.sizes[m.UID] == want
	g.mu.Unlock()
	if done {
		return ""
	}
	var waiting []string
	for _, disk := range m.Disks {
		if disk.Imported {
			continue
		}
		if msg := grow(disk); msg != "" {
			waiting = append(waiting, msg)
		}
	}
	if len(waiting) > 0 {
		return strings.Join(waiting, "; ")
	}
	g.Found(m)
	return ""
}

// Found remembers m's disk sizes as in place: for disks just made at them.
func (g *GrownDisks) Found(m Machine) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.sizes == nil {
		g.sizes = map[string]string{}
	}
	g.sizes[m.UID] = diskSizes(m)
}

// Forget forgets the guest uid: a deleted one, or one whose disks must be
// looked at again.
func (g *GrownDisks) Forget(uid string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.sizes, uid)
}

// diskSizes names the sizes of m's disks.
func diskSizes(m Machine) string {
	var b strings.Builder
	for _, disk := range m.Disks {
		fmt.Fprintf(&b, "%s/%s=%d;", disk.Pool, disk.Name, disk.SizeBytes)
	}
	return b.String()
}
