package imageimport

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/virtfleet/virtfleet/agent/driver"
)

// TestPruneClock walks two images through prune rounds: each step moves
// the clock, says which images are on the node and used, and which the
// round finds due.
func TestPruneClock(t *testing.T) {
	var c PruneClock
	c.SetPruneAfter("a", time.Hour)
	now := time.Now()
	steps := []struct {
		name    string
		advance time.Duration
		used    map[string]bool
		due     []string
		pruned  []string
	}{
		{name: "AnUsedImageHasNoClock", used: map[string]bool{"a": true, "b": true}},
		{name: "AnUnusedOneStartsIt", advance: 10 * time.Hour, used: map[string]bool{"a": false, "b": true}},
		{name: "AndStaysForItsPruneAfter", advance: 59 * time.Minute, used: map[string]bool{"a": false, "b": true}},
		{name: "ThenItIsDue", advance: time.Minute, used: map[string]bool{"a": false, "b": true}, due: []string{"a"}},
		{name: "UntilItIsUsedAgain", used: map[string]bool{"a": true, "b": true}},
		{name: "WhichStartsItsClockAfresh", advance: time.Minute, used: map[string]bool{"a": false, "b": true}},
		{name: "UnusedForItsPruneAfterItIsDueAgain", advance: time.Hour, used: map[string]bool{"a": false, "b": false}, due: []string{"a"}, pruned: []string{"a"}},
		{name: "APrunedImageImportedAgainStartsAfresh", advance: driver.DefaultPruneAfter - time.Hour, used: map[string]bool{"a": false, "b": false}},
		{name: "AnImageWithoutPruneAfterHasTheDefault", advance: time.Hour, used: map[string]bool{"b": false}, due: []string{"b"}},
		{name: "AnImageThatLeftTheNodeStartsAfresh", advance: 0, used: map[string]bool{"a": false}},
		{name: "AndIsDueAfterItsPruneAfter", advance: time.Hour, used: map[string]bool{"a": false}, due: []string{"a"}},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			now = now.Add(s.advance)
			assert.Equal(t, s.due, c.Due(now, s.used))
			for _, uid := range s.pruned {
				c.Pruned(uid)
			}
		})
	}
}
