package benchmark

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// -only keeps the scenarios named and drops the rest, as sized, and
// refuses a name it does not know; the result names what ran.
func TestOnlyKeepsTheScenariosNamed(t *testing.T) {
	cases := map[string]struct {
		only []string
		want []string
		err  bool
	}{
		"the real guest alone": {
			only: []string{"guest"},
			want: []string{"real guest (boot, snapshots, backups)"},
		},
		"bursts and the migration": {
			only: []string{"bursts", " migration"},
			want: []string{"bursts (10, 100, 1000, 5000 VMs)", "live migration"},
		},
		"every one": {
			only: Scenarios,
			want: []string{"density (100 VMs)", "bursts (10, 100, 1000, 5000 VMs)", "scale (1000, 10000 VMs over simulated nodes)",
				"real guest (boot, snapshots, backups)", "live migration", "idle node",
				"dense node (1000 guests, simulated)", "dense node (500 guests, test driver)"},
		},
		"one dense node": {
			only: []string{"dense-libvirt"},
			want: []string{"dense node (500 guests, test driver)"},
		},
		"an unknown name": {only: []string{"guests"}, err: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			o := Defaults()
			err := o.Only(tc.only)
			if tc.err {
				assert.Error(t, err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, o.scenarios())
		})
	}
	o := Defaults()
	o.Snapshots, o.Backups = false, false
	require.NoError(t, o.Only([]string{"guest"}))
	assert.Equal(t, []string{"real guest (boot)"}, o.scenarios(), "the guest's parts follow their own flags")
}

func measuredSnapshots() *GuestSnapshots {
	return &GuestSnapshots{
		PingIntervalSeconds: 0.01, BaselineGapSeconds: 0.03,
		DiskOnly: SnapshotRun{Name: "guest-disks", Phase: "Succeeded", Frozen: true, PauseSeconds: 0.15, DurationSeconds: 3.2,
			CreateToReadySeconds: 4.1, SizeBytes: 120 << 20, DiskGrowthBytes: 121 << 20},
		Memory: SnapshotRun{Name: "guest-memory", Phase: "Succeeded", Memory: true, PauseSeconds: 2.5, DurationSeconds: 8.5,
			CreateToReadySeconds: 9.5, SizeBytes: 130 << 20, DiskGrowthBytes: -1},
		Restore: SnapshotRestore{Name: "guest-back", Phase: "Succeeded", DurationSeconds: 5, CreateToRunningSeconds: 12,
			PauseSeconds: 4, CreateToAnswerSeconds: 7, CreateToSSHSeconds: 15, SameBoot: true},
	}
}

// The snapshots' section gives each snapshot's pause, times and bytes
// beside the targets, the restore's times, the anchors, and what failed.
func TestMarkdownShowsTheSnapshots(t *testing.T) {
	cases := map[string]struct {
		snapshots *GuestSnapshots
		want      []string
		wantNone  bool
	}{
		"measured": {
			snapshots: measuredSnapshots(),
			want: []string{
				"## Snapshots of the real guest, and a restore",
				"every 10 ms", "the longest was 30 ms",
				"| guest-visible pause (longest ping gap) | 150 ms | 2500 ms | disk-only ≤ 0.2 s |",
				"| create→readyToUse, seen by the benchmark | 4.1 s | 9.5 s | with memory ≤ 10 s |",
				"| bytes written: status.size (qcow2 growth, node) | 120.0 MiB | 130.0 MiB | |",
				"| bytes written: root disk file's growth (benchmark) | 121.0 MiB | – | |",
				"| create→Succeeded and the VM Running | 12.0 s | ≤ 10 s |",
				"| create→the guest answers again (the reply ending that gap) | 7.0 s | |",
				"| the same boot as before the snapshot (resumed, not booted) | yes | |",
				"vSphere stuns a VM for about 0.2 s", "KubeVirt gives an online snapshot 5 minutes",
			},
		},
		"failed": {
			snapshots: &GuestSnapshots{DiskOnly: SnapshotRun{Phase: "Failed"}, Notes: []string{"snapshot guest-disks Failed: no space"}},
			want:      []string{"| phase | Failed | – | |", "- snapshot guest-disks Failed: no space"},
		},
		"skipped": {
			snapshots: &GuestSnapshots{Skipped: "the guest did not boot (see its section)"},
			want:      []string{"Skipped: the guest did not boot (see its section)."},
		},
		"not asked for": {wantNone: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			md := Markdown(&Result{Snapshots: tc.snapshots})
			if tc.wantNone {
				assert.NotContains(t, md, "Snapshots of the real guest")
				return
			}
			for _, w := range tc.want {
				assert.Contains(t, md, w)
			}
		})
	}
}

// Each target is judged as the issue states it and met only by what
// succeeded; what was not measured is not judged.
func TestSnapshotTargetsJudgeIssue53s(t *testing.T) {
	got := map[string]bool{}
	for _, tg := range Targets(&Result{Snapshots: measuredSnapshots()}) {
		got[tg.Name] = tg.Met
	}
	assert.Equal(t, map[string]bool{
		"disk-only snapshot of the idle real guest: guest-visible pause (longest ping gap)": true,
		"snapshot with memory of the idle real guest: total, create→readyToUse":             true,
		"restore of the snapshot with memory: create→Running":                               false,
	}, got)

	sn := measuredSnapshots()
	sn.DiskOnly.Phase, sn.Memory.Phase = "Failed", "Failed"
	for _, tg := range snapshotTargets(sn)[:2] {
		assert.False(t, tg.Met, "a failed snapshot meets nothing: %s", tg.Name)
	}
	only := snapshotTargets(&GuestSnapshots{DiskOnly: SnapshotRun{Phase: "Succeeded"}})
	require.Len(t, only, 1, "what did not run is not judged")
	assert.False(t, only[0].Met, "a pause that was not measured meets nothing")
	assert.Equal(t, "≤ 0.2 s", only[0].Goal)
	assert.Empty(t, snapshotTargets(&GuestSnapshots{Skipped: "no hypervisor"}))
	assert.Empty(t, snapshotTargets(nil))
}
