package benchmark

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestMigrationTargets(t *testing.T) {
	for name, tc := range map[string]struct {
		run  *MigrationRun
		want []bool // Met of each target
	}{
		"NotRun":                    {run: nil},
		"Skipped":                   {run: &MigrationRun{Skipped: "no libvirtd", NeighbourGapMilliseconds: 100}},
		"NotMeasured":               {run: &MigrationRun{DowntimeMilliseconds: 200}},
		"WithinBoth":                {run: &MigrationRun{DowntimeMilliseconds: 250, NeighbourGapMilliseconds: 290}, want: []bool{true}},
		"OverTheFixedLimit":         {run: &MigrationRun{DowntimeMilliseconds: 400, NeighbourGapMilliseconds: 310}, want: []bool{false}},
		"OverOneAndAHalfDowntimes":  {run: &MigrationRun{DowntimeMilliseconds: 100, NeighbourGapMilliseconds: 160}, want: []bool{false}},
		"AtOneAndAHalfDowntimes":    {run: &MigrationRun{DowntimeMilliseconds: 100, NeighbourGapMilliseconds: 150}, want: []bool{true}},
		"NoDowntimeReportedMeetsNo": {run: &MigrationRun{NeighbourGapMilliseconds: 10}, want: []bool{false}},
	} {
		t.Run(name, func(t *testing.T) {
			var met []bool
			for _, tg := range migrationTargets(tc.run) {
				met = append(met, tg.Met)
				assert.Contains(t, tg.Measured, "libvirt's downtime")
			}
			assert.Equal(t, tc.want, met)
		})
	}
}

func TestLastHost(t *testing.T) {
	for cidr, want := range map[string]string{
		"10.231.11.0/24": "10.231.11.254",
		"10.0.0.0/16":    "10.0.255.254",
		"10.1.2.8/29":    "10.1.2.14",
	} {
		assert.Equal(t, want, lastHost(netip.MustParsePrefix(cidr)).String(), cidr)
	}
}
