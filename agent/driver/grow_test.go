package driver

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestGrownDisks walks one guest's disks through Grow: each step pins the
// disks grow is asked about and what Grow says.
func TestGrownDisks(t *testing.T) {
	var g GrownDisks
	m := Machine{UID: "u1", Disks: []Disk{{Name: "root", SizeBytes: 1 << 30}, {Name: "imported", Imported: true}, {Name: "data", SizeBytes: 2 << 30}}}
	steps := []struct {
		name   string
		change func(m *Machine)
		refuse map[string]string
		asked  []string
		says   string
	}{
		{name: "a guest not seen before has every disk but imported ones looked at", change: func(*Machine) {}, asked: []string{"root", "data"}},
		{name: "sizes found in place are not looked at again", change: func(*Machine) {}},
		{name: "a new size has the disks looked at again", change: func(m *Machine) { m.Disks[0].SizeBytes = 3 << 30 }, asked: []string{"root", "data"}},
		{name: "what is not grown yet is said, joined", change: func(m *Machine) { m.Disks[2].SizeBytes = 4 << 30 },
			refuse: map[string]string{"root": "root waits", "data": "data waits"}, asked: []string{"root", "data"}, says: "root waits; data waits"},
		{name: "and asked again at the next Grow", change: func(*Machine) {}, refuse: map[string]string{"data": "data waits"}, asked: []string{"root", "data"}, says: "data waits"},
		{name: "until every disk is as big as asked", change: func(*Machine) {}, asked: []string{"root", "data"}},
		{name: "then nothing is asked", change: func(*Machine) {}},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			s.change(&m)
			var asked []string
			says := g.Grow(m, func(d Disk) string {
				asked = append(asked, d.Name)
				return s.refuse[d.Name]
			})
			assert.Equal(t, s.asked, asked)
			assert.Equal(t, s.says, says)
		})
	}
	g.Forget(m.UID)
	var asked int
	g.Grow(m, func(Disk) string { asked++; return "" })
	assert.Equal(t, 2, asked, "a forgotten guest's disks are looked at again")
}
