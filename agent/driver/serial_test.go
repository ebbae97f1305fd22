package driver

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestDiskSerialsFitVirtioAndTellVolumesApart pins the serials disks get
// from their volumes' names.
func TestDiskSerialsFitVirtioAndTellVolumesApart(t *testing.T) {
	long := "team-a_database-replica-data"
	for _, tc := range []struct {
		name, vol string
		// prefix is how the serial starts; whole says it is the name.
		prefix string
		whole  bool
	}{
		{name: "a short name is the serial", vol: "team-a_web-data", prefix: "team-a_web-data", whole: true},
		{name: "twenty bytes are the serial", vol: "team-a_web-data-0001", prefix: "team-a_web-data-0001", whole: true},
		{name: "a longer name keeps its start", vol: long + "-1", prefix: "team-a_data"},
		{name: "another one sharing its first twenty bytes", vol: long + "-2", prefix: "team-a_data"},
		{name: "characters libvirt refuses become underscores", vol: "pool/vol@snap", prefix: "pool_vol_sn"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := DiskSerial(tc.vol)
			assert.LessOrEqual(t, len(got), MaxSerial)
			assert.True(t, strings.HasPrefix(got, tc.prefix), "%q from %q", got, tc.vol)
			assert.Equal(t, tc.whole, got == tc.vol)
			assert.Equal(t, got, DiskSerial(tc.vol), "the same every time")
			assert.Regexp(t, `^[A-Za-z0-9_.+-]+$`, got, "only what libvirt accepts")
		})
	}
	assert.NotEqual(t, DiskSerial(long+"-1"), DiskSerial(long+"-2"), "two Volumes, two serials")
}
