package backupschedule

import (
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
)

func TestPrune(t *testing.T) {
	// Monday 2026-11-02 is the first day of ISO week 45.
	monday := time.Date(2026, 11, 2, 0, 0, 0, 0, time.UTC)
	at := func(day, hour int) time.Time { return monday.AddDate(0, 0, day).Add(time.Duration(hour) * time.Hour) }
	ok := func(name string, at time.Time) Taken {
		return Taken{Name: name, At: at, Phase: v1alpha1.BackupSucceeded}
	}
	failed := func(name string, at time.Time) Taken { return Taken{Name: name, At: at, Phase: v1alpha1.BackupFailed} }
	running := func(name string, at time.Time) Taken {
		return Taken{Name: name, At: at, Phase: v1alpha1.BackupInProgress}
	}

	// Four backups a day, at 0, 6, 12 and 18 h, over 15 days (three weeks
	// and a day): dDhH.
	var fortnight []Taken
	for d := range 15 {
		for h := 0; h < 24; h += 6 {
			fortnight = append(fortnight, ok(name(d, h), at(d, h)))
		}
	}
	berlin, err := time.LoadLocation("Europe/Berlin")
	require.NoError(t, err)

	cases := map[string]struct {
		taken []Taken
		r     v1alpha1.BackupRetention
		tz    *time.Location
		// wantKept are the Succeeded backups left; Failed and running ones
		// are checked through wantPruned.
		wantKept   []string
		wantPruned []string
	}{
		"NoRuleKeepsEverySuccess": {
			taken:    []Taken{ok("a", at(0, 0)), ok("b", at(0, 6))},
			wantKept: []string{"a", "b"},
		},
		"LastKeepsTheNewestN": {
			taken:    fortnight,
			r:        v1alpha1.BackupRetention{Last: 3},
			wantKept: []string{name(14, 18), name(14, 12), name(14, 6)},
		},
		"DailyKeepsTheNewestOfEachDay": {
			taken:    fortnight,
			r:        v1alpha1.BackupRetention{Daily: 3},
			wantKept: []string{name(14, 18), name(13, 18), name(12, 18)},
		},
		"DaysLastCoversDoNotCountForDaily": {
			taken: fortnight,
			r:     v1alpha1.BackupRetention{Last: 5, Daily: 2},
			// Last keeps days 14 (all four) and 13 (18 h): daily's two days
			// are 12 and 11.
			wantKept: []string{name(14, 18), name(14, 12), name(14, 6), name(14, 0), name(13, 18), name(12, 18), name(11, 18)},
		},
		"WeeklyKeepsTheNewestOfEachISOWeek": {
			taken: fortnight,
			r:     v1alpha1.BackupRetention{Weekly: 3},
			// Day 14 is Monday of week 47, day 13 Sunday of week 46, day 6
			// Sunday of week 45.
			wantKept: []string{name(14, 18), name(13, 18), name(6, 18)},
		},
		"LastDailyWeeklyTogether": {
			taken:    fortnight,
			r:        v1alpha1.BackupRetention{Last: 1, Daily: 2, Weekly: 2},
			wantKept: []string{name(14, 18), name(13, 18), name(12, 18), name(6, 18)},
		},
		"MoreRoomThanBackupsKeepsAll": {
			taken:    []Taken{ok("a", at(0, 0)), ok("b", at(1, 0))},
			r:        v1alpha1.BackupRetention{Daily: 7, Weekly: 4},
			wantKept: []string{"a", "b"},
		},
		"DaysAreThoseOfTheTimeZone": {
			// 23:30 UTC on day 0 is 00:30 on day 1 in Berlin: one day there.
			taken:    []Taken{ok("late", at(0, 23).Add(30*time.Minute)), ok("next", at(1, 12))},
			r:        v1alpha1.BackupRetention{Daily: 2},
			tz:       berlin,
			wantKept: []string{"next"},
		},
		"TheNewestSuccessIsKeptEvenByNoRule": {
			// Daily 1 keeps the newest of the newest day; the failed one
			// after it does not count.
			taken:      []Taken{ok("a", at(0, 0)), ok("b", at(1, 0)), failed("c", at(2, 0))},
			r:          v1alpha1.BackupRetention{Daily: 1, Failed: 1},
			wantKept:   []string{"b"},
			wantPruned: []string{"a"},
		},
		"FailedBeyondTheNewestNArePruned": {
			taken:      []Taken{failed("f1", at(0, 0)), failed("f2", at(1, 0)), failed("f3", at(2, 0)), ok("a", at(3, 0))},
			r:          v1alpha1.BackupRetention{Last: 1, Failed: 1},
			wantKept:   []string{"a"},
			wantPruned: []string{"f2", "f1"},
		},
		"RunningBackupsAreNeverPruned": {
			taken:      []Taken{ok("a", at(0, 0)), ok("b", at(1, 0)), running("c", at(2, 0)), {Name: "d", At: at(0, 1)}},
			r:          v1alpha1.BackupRetention{Last: 1},
			wantKept:   []string{"b"},
			wantPruned: []string{"a"},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			tz := tc.tz
			if tz == nil {
				tz = time.UTC
			}
			pruned := Prune(tc.taken, tc.r, tz)
			var kept []string
			for _, b := range tc.taken {
				if b.Phase == v1alpha1.BackupSucceeded && !slices.Contains(pruned, b.Name) {
					kept = append(kept, b.Name)
				}
			}
			assert.ElementsMatch(t, tc.wantKept, kept)
			if tc.wantPruned != nil {
				assert.ElementsMatch(t, tc.wantPruned, pruned)
			}
		})
	}
}

func name(day, hour int) string {
	return time.Date(2026, 11, 2+day, hour, 0, 0, 0, time.UTC).Format("d02h15")
}
