package backupschedule

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
)

// Taken is one of a schedule's backups as retention sees it.
type Taken struct {
	Name string
	// At is the time the backup was scheduled for.
	At    time.Time
	Phase v1alpha1.BackupPhase
}

// Prune returns the names of the backups r no longer keeps, of those
// taken: the Succeeded ones no rule keeps, and the Failed ones beyond the
// newest r.Failed. It follows Proxmox Backup Server's prune: backups are
// considered newest first, Last keeps the newest N, then Daily and Weekly
// each keep the newest backup of each period (day, ISO week, in tz) until
// they hold N periods; a period a rule before them kept a backup of does
// not count against their N. With no rule set every Succeeded backup is
// kept, and the newest Succeeded one always is. Backups not yet done are
// never pruned.
func Prune(taken []Taken, r v1alpha1.BackupRetention, tz *time.Location) []string {
	var succeeded, failed []Taken
	for _, t := range taken {
		switch t.Phase {
		case v1alpha1.BackupSucceeded:
			succeeded = append(succeeded, t)
		case v1alpha1.BackupFailed:
			failed = append(failed, t)
		}
	}
	newestFirst := func(a, b Taken) int {
		if c := b.At.Compare(a.At); c != 0 {
			return c
		}
		return strings.Compare(b.Name, a.Name)
	}
	slices.SortFunc(succeeded, newestFirst)
	slices.SortFunc(failed, newestFirst)

	var prune []string
	if r.Last > 0 || r.Daily > 0 || r.Weekly > 0 {
		kept := map[string]bool{}
		keepPeriods(succeeded, kept, int(r.Last), func(t Taken) string { return t.Name })
		keepPeriods(succeeded, kept, int(r.Daily), func(t Taken) string { return t.At.In(tz).Format(time.DateOnly) })
		keepPeriods(succeeded, kept, int(r.Weekly), func(t Taken) string {
			y, w := t.At.In(tz).ISOWeek()
			return fmt.Sprintf("%d-W%02d", y, w)
		})
		for i, t := range succeeded {
			if !kept[t.Name] && i > 0 {
				prune = append(prune, t.Name)
			}
		}
	}
	for i, t := range failed {
		if i >= int(r.Failed) {
			prune = append(prune, t.Name)
		}
	}
	return prune
}

// keepPeriods marks in kept the newest backup of each of the n newest
// periods of newestFirst that no backup kept already falls in.
func keepPeriods(newestFirst []Taken, kept map[string]bool, n int, period func(Taken) string) {
	if n <= 0 {
		return
	}
	covered := map[string]bool{}
	for _, t := range newestFirst {
		if kept[t.Name] {
			covered[period(t)] = true
		}
	}
	periods := map[string]bool{}
	for _, t := range newestFirst {
		p := period(t)
		if kept[t.Name] || covered[p] || periods[p] {
			continue
		}
		if len(periods) >= n {
			return
		}
		periods[p] = true
		kept[t.Name] = true
	}
}
