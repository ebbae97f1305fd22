package benchmark

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The pause is the longest gap between two replies that overlaps the
// window, wherever in it, and is known only once replies came on both
// sides of the window.
func TestLongestGapIsThePauseInTheWindow(t *testing.T) {
	t0 := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	at := func(ms ...int) []time.Time {
		out := make([]time.Time, len(ms))
		for i, m := range ms {
			out[i] = t0.Add(time.Duration(m) * time.Millisecond)
		}
		return out
	}
	cases := map[string]struct {
		replies  []time.Time
		from, to int
		gap      time.Duration
		ended    int
		ok       bool
	}{
		"a pause inside the window": {
			replies: at(0, 10, 20, 30, 530, 540, 550), from: 15, to: 545,
			gap: 500 * time.Millisecond, ended: 530, ok: true,
		},
		"a pause that began before the window counts": {
			replies: at(0, 10, 400, 410, 420), from: 100, to: 415,
			gap: 390 * time.Millisecond, ended: 400, ok: true,
		},
		"a pause that ends after the window counts": {
			replies: at(0, 10, 20, 900), from: 5, to: 100,
			gap: 880 * time.Millisecond, ended: 900, ok: true,
		},
		"pauses outside the window do not": {
			replies: at(0, 800, 810, 820, 830, 1900), from: 805, to: 825,
			gap: 10 * time.Millisecond, ended: 810, ok: true,
		},
		"no reply after the window yet": {
			replies: at(0, 10, 20), from: 5, to: 30,
		},
		"no reply before the window": {
			replies: at(10, 20, 30), from: 5, to: 25,
		},
		"no replies": {from: 5, to: 25},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			gap, ended, ok := longestGap(tc.replies, t0.Add(time.Duration(tc.from)*time.Millisecond), t0.Add(time.Duration(tc.to)*time.Millisecond))
			assert.Equal(t, tc.ok, ok)
			assert.Equal(t, tc.gap, gap)
			if tc.ok {
				assert.Equal(t, t0.Add(time.Duration(tc.ended)*time.Millisecond), ended)
			}
		})
	}
}

// The prober, on a raw socket made in another network namespace, sees
// that namespace's address answer every interval, and sees it stop
// answering while the namespace's loopback is down.
func TestProberSeesAPauseInItsNamespace(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: a network namespace and a raw ICMP socket")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs ip (iproute2)")
	}
	ns := fmt.Sprintf("vfbenchping-%d", os.Getpid())
	ip := func(args ...string) {
		t.Helper()
		out, err := exec.Command("ip", args...).CombinedOutput()
		require.NoError(t, err, "ip %v: %s", args, out)
	}
	ip("netns", "add", ns)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	lo := func(state string) { ip("netns", "exec", ns, "ip", "link", "set", "lo", state) }
	lo("up")

	p, err := startProber("/run/netns/"+ns, "127.0.0.1")
	require.NoError(t, err)
	defer p.stop()
	ctx := context.Background()
	require.NoError(t, p.waitAnswer(ctx, time.Now(), 10*time.Second), "the namespace's loopback answers")
	answering := time.Now()
	require.NoError(t, p.waitAnswer(ctx, answering.Add(time.Second), 10*time.Second), "and goes on answering")
	gap, _, ok := p.gap(answering, answering.Add(time.Second))
	require.True(t, ok)
	assert.Less(t, gap, 500*time.Millisecond, "an address that answers shows no pause")

	down := time.Now()
	lo("down")
	// The pause the prober is to see: loopback down this long.
	time.Sleep(300 * time.Millisecond)
	lo("up")
	up := time.Now()
	require.NoError(t, p.waitAnswer(ctx, up, 10*time.Second), "it answers again once loopback is up")
	gap, ended, ok := p.gap(down, up)
	require.True(t, ok)
	t.Logf("longest gap %s with loopback down for %s", gap, up.Sub(down))
	assert.GreaterOrEqual(t, gap, 300*time.Millisecond, "the pause is seen whole")
	assert.Less(t, gap, up.Sub(down)+time.Second, "and not much longer than it was")
	assert.True(t, ended.After(down.Add(300*time.Millisecond)), "the reply that ends the pause came once loopback was up again")
}

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
