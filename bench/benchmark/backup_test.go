package benchmark

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func measuredBackup() *GuestBackup {
	return &GuestBackup{
		Location: "local", DiskBytes: 4 << 30,
		Full: BackupRun{Phase: "Succeeded", Full: true, Frozen: true, DurationSeconds: 20, BytesRead: 1000 << 20, BytesWritten: 900 << 20,
			ChunksWritten: 900, ChunksReused: 100, ReadBytesPerSecond: 50 << 20},
		Raw:               RawUpload{Bytes: 1000 << 20, Seconds: 12.5, BytesPerSecond: 80 << 20},
		GuestWrittenBytes: 100 << 20,
		Incremental: BackupRun{Phase: "Succeeded", Frozen: true, DurationSeconds: 4, BytesRead: 110 << 20, BytesWritten: 104 << 20,
			ChunksWritten: 104, ChunksReused: 6, ReadBytesPerSecond: 27.5 * (1 << 20)},
		IncrementalReadOfWritten: 1.1, FullOfRaw: 0.625, IncrementalOfRaw: 0.34375, StopSeconds: 6,
		Restore: RestoreRun{BootTimes: BootTimes{ImportSeconds: 30, CreateToRunningSeconds: 45, CreateToAddressSeconds: 70, CreateToSSHSeconds: 88}, SHA256: "ab", Intact: true},
	}
}

// The backups' section gives each backup's figures beside the raw upload's,
// the ratios against issue 54's limit, the restore's times, and what failed.
func TestMarkdownShowsTheBackups(t *testing.T) {
	cases := map[string]struct {
		backup   *GuestBackup
		want     []string
		wantNone bool
	}{
		"measured": {
			backup: measuredBackup(),
			want: []string{
				"## Backups of the real guest, and a restore",
				"| bytes read of the disk | 1000.0 MiB of 4.0 GiB | 110.0 MiB (1.10× the 100 MiB written) | | |",
				"| chunks written / reused | 900 / 100 | 104 / 6 | | |",
				"| duration | 20.0 s | 4.0 s | 12.5 s | |",
				"| throughput (bytes read / duration) | 50.0 MiB/s | 27.5 MiB/s | 80.0 MiB/s | |",
				"| of the raw upload's throughput | 62% (not met) | 34% (not met) | | ≥ 70% |",
				"| create→ssh | 88.0 s |",
				"as backed up (sha256) | yes |",
			},
		},
		"failed": {
			backup: &GuestBackup{Full: BackupRun{Phase: "Failed"}, Notes: []string{"backup guest-full Failed: no space"}},
			want:   []string{"| phase | Failed | – |", "- backup guest-full Failed: no space", "| create→ssh | – |"},
		},
		"skipped": {
			backup: &GuestBackup{Skipped: "the guest did not boot (see its section)"},
			want:   []string{"Skipped: the guest did not boot (see its section)."},
		},
		"not asked for": {wantNone: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			md := Markdown(&Result{Backup: tc.backup})
			if tc.wantNone {
				assert.NotContains(t, md, "Backups of the real guest")
				return
			}
			for _, w := range tc.want {
				assert.Contains(t, md, w)
			}
		})
	}
}

// Each backup that ended is judged against the raw upload, and met only
// when it succeeded at 70 % of it or more; without a raw upload there is
// nothing to judge.
func TestBackupTargetsJudgeIssue54sLimit(t *testing.T) {
	b := measuredBackup()
	b.FullOfRaw = 0.72
	got := map[string]bool{}
	for _, tg := range Targets(&Result{Backup: b}) {
		got[tg.Name] = tg.Met
	}
	assert.Equal(t, map[string]bool{
		"full backup of the real guest: read throughput vs a raw upload to the same store":        true,
		"incremental backup of the real guest: read throughput vs a raw upload to the same store": false,
	}, got)

	b.Full.Phase = "Failed"
	assert.False(t, backupTargets(b)[0].Met, "a failed backup meets nothing")

	b.Raw = RawUpload{}
	assert.Empty(t, backupTargets(b))
	assert.Empty(t, backupTargets(&GuestBackup{Skipped: "no hypervisor"}))
}

// The digest is read from sha256sum's line for the file, whatever else
// the guest printed: sudo warns on stderr in a guest made again under
// another name.
func TestSHA256OfSkipsWarnings(t *testing.T) {
	sum := "d5224a49b3b19887be49306bf9aeee36ef90351fd3c7f667f1f5c4994758f9ee"
	assert.Equal(t, sum, sha256Of(sum+"  /var/tmp/bench", "/var/tmp/bench"))
	assert.Equal(t, sum, sha256Of("sudo: unable to resolve host restored: Name or service not known\n"+sum+"  /var/tmp/bench", "/var/tmp/bench"))
	assert.Empty(t, sha256Of("sha256sum: /var/tmp/bench: No such file or directory", "/var/tmp/bench"))
	assert.Empty(t, sha256Of("", "/var/tmp/bench"))
}
