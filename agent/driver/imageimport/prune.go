package imageimport

import (
	"sort"
	"sync"
	"time"

	"github.com/virtfleet/virtfleet/agent/driver"
)

// PruneClock tells when the images of a node may go: each once no disk has
// used it for its PruneAfter, timed from the first prune round that found
// it unused. It is kept in memory only: after a restart the clock starts
// again, which delays pruning but never prunes early. The zero value is
// ready to use.
type PruneClock struct {
	mu sync.Mutex
	// after is each image's PruneAfter as Ensure last gave it.
	after map[string]time.Duration
	// since is when each image on the node was first seen unused.
	since map[string]time.Time
}

// SetPruneAfter records how long image uid may stay unused: the PruneAfter
// of the last Ensure that needed it. Zero or less means
// driver.DefaultPruneAfter.
func (c *PruneClock) SetPruneAfter(uid string, after time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.after == nil {
		c.after = map[string]time.Duration{}
	}
	c.after[uid] = after
}

// Due takes the images on the node at now, by uid, each saying whether a
// disk uses it. It starts the clock of each image newly unused, stops
// that of each one used or gone, and returns, sorted, those unused for
// their PruneAfter: the caller deletes them and reports each it deleted
// with Pruned.
func (c *PruneClock) Due(now time.Time, used map[string]bool) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.since == nil {
		c.since = map[string]time.Time{}
	}
	for uid := range c.since {
		if inUse, present := used[uid]; inUse || !present {
			delete(c.since, uid)
		}
	}
	var due []string
	for uid, inUse := range used {
		if inUse {
			continue
		}
		since, ok := c.since[uid]
		if !ok {
			c.since[uid], since = now, now
		}
		after := c.after[uid]
		if after <= 0 {
			after = driver.DefaultPruneAfter
		}
		if now.Sub(since) >= after {
			due = append(due, uid)
		}
	}
	sort.Strings(due)
	return due
}

// Pruned stops the clock of image uid, deleted from the node: imported
// again, it starts unused afresh.
func (c *PruneClock) Pruned(uid string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.since, uid)
}
