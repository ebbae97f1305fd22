package nova_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/internal/harness/openstacktest"
)

// TestDisksGrowByCinderExtend walks a running server's attached boot
// volume through size changes: each step pins the extends asked of Cinder
// (the stand-in refuses an attached volume's below microversion 3.42, as
// Cinder does), the volume's size, and what Ensure reports.
func TestDisksGrowByCinderExtend(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := newCloud(t, password)
	d := c.open(t)
	m := machine("grown")
	ensure(t, d, m, driver.PhaseRunning)
	rootSize := func() int {
		for _, v := range c.Volumes() {
			if v.Name == m.Disks[0].Name {
				return v.SizeGiB
			}
		}
		return 0
	}
	extends := func() int {
		return c.CountRequests(http.MethodPost, openstacktest.VolumePath+"/*/volumes/*/action")
	}
	reads := func() int { return c.CountRequests(http.MethodGet, openstacktest.VolumePath+"/*/volumes/*") }

	steps := []struct {
		name    string
		change  func(m *driver.Machine)
		fail    bool
		extends int
		reads   int
		size    int
		message string
	}{
		{name: "a larger size extends the attached volume, rounded up to whole GiB", change: func(m *driver.Machine) { m.Disks[0].SizeBytes = 2<<30 + 1 },
			extends: 1, reads: 1, size: 3, message: "is growing to 3 GiB"},
		{name: "the next Ensure finds it grown", change: func(*driver.Machine) {}, reads: 1, size: 3},
		{name: "a grown disk is not read again", change: func(*driver.Machine) {}, size: 3},
		{name: "a smaller size leaves the volume as it is", change: func(m *driver.Machine) { m.Disks[0].SizeBytes = 1 << 30 }, reads: 1, size: 3},
		{name: "an extend Cinder refuses leaves the server running and says why", change: func(m *driver.Machine) { m.Disks[0].SizeBytes = 4 << 30 }, fail: true,
			extends: 1, reads: 1, size: 3, message: "cannot grow disk ns_grown-root to 4 GiB"},
		{name: "a refused extend is tried again", change: func(*driver.Machine) {}, extends: 1, reads: 1, size: 4, message: "is growing to 4 GiB"},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			s.change(&m)
			if s.fail {
				c.FailNext(http.MethodPost, openstacktest.VolumePath+"/*/volumes/*/action", 1, http.StatusBadRequest, 0)
			}
			e, r := extends(), reads()
			o, err := d.Ensure(ctx, m)
			require.NoError(t, err, "a disk that cannot grow fails no Ensure")
			assert.Equal(t, s.extends, extends()-e, "extends")
			assert.Equal(t, s.reads, reads()-r, "volume reads")
			assert.Equal(t, s.size, rootSize(), "GiB")
			assert.Equal(t, driver.PhaseRunning, o.Phase)
			assert.False(t, o.RestartRequired, "a disk's size needs no restart")
			if s.message == "" {
				assert.Empty(t, o.Message)
			} else {
				assert.Contains(t, o.Message, s.message)
			}
		})
	}
}
