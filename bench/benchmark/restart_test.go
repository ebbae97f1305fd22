package benchmark

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestParseQueueReadsTheVMController: the hub's observes of VMs and the
// VM controller's queue depth, not another controller's; reconciles the
// rate limit deferred are no observes.
func TestParseQueueReadsTheVMController(t *testing.T) {
	cases := map[string]struct {
		metrics string
		want    queue
		err     string
	}{
		"BusyQueue": {metrics: `# TYPE controller_runtime_reconcile_total counter
controller_runtime_reconcile_total{controller="managed/virtualmachine.compute.virtfleet.io",result="success"} 10
controller_runtime_reconcile_total{controller="managed/virtualmachine.compute.virtfleet.io",result="requeue_after"} 5
controller_runtime_reconcile_total{controller="managed/volume.compute.virtfleet.io",result="success"} 100
# TYPE virtfleet_hub_vm_observes_total counter
virtfleet_hub_vm_observes_total 12
# TYPE workqueue_depth gauge
workqueue_depth{controller="managed/virtualmachine.compute.virtfleet.io",name="managed/virtualmachine.compute.virtfleet.io"} 7
workqueue_depth{controller="managed/volume.compute.virtfleet.io",name="managed/volume.compute.virtfleet.io"} 3
`, want: queue{observes: 12, depth: 7}},
		"NoQueueYet": {metrics: `# TYPE workqueue_depth gauge
workqueue_depth{controller="managed/volume.compute.virtfleet.io",name="managed/volume.compute.virtfleet.io"} 0
`, err: "no workqueue_depth of managed/virtualmachine.compute.virtfleet.io"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			q, err := parseQueue(strings.NewReader(tc.metrics))
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, q)
		})
	}
}

// TestRestartTargets: the restart of the largest burst over simulated
// nodes is judged by its time and its writes per VM; one that never ended
// meets neither time nor goal; one that could not be measured fails its
// time and says why, and has no writes to judge.
func TestRestartTargets(t *testing.T) {
	cases := map[string]struct {
		restart     HubRestart
		fast, quiet bool
	}{
		"Met":         {restart: HubRestart{VMs: 10100, Seconds: 40, Observes: 10100, WritesPerVM: 0.01}, fast: true, quiet: true},
		"Slow":        {restart: HubRestart{VMs: 10100, Seconds: 301, Observes: 10100}, quiet: true},
		"Writes":      {restart: HubRestart{VMs: 10100, Seconds: 40, Observes: 10100, WritesPerVM: 1}, fast: true},
		"NeverDone":   {restart: HubRestart{VMs: 10100, Seconds: 20, TimedOut: true, Observes: 20}, quiet: true},
		"NotMeasured": {restart: HubRestart{VMs: 10100, Error: "cannot list VolumeList: http2: client connection lost"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			r := tc.restart
			got := map[string]Target{}
			for _, tg := range scaleTargets([]Scenario{{VMs: 10000, Nodes: 100, HubRestart: &r}}) {
				got[tg.Name] = tg
			}
			time, ok := got["hub killed and restarted at 10100 VMs: the new hub has observed every VM"]
			require.True(t, ok, "%v", got)
			assert.Equal(t, tc.fast, time.Met, time.Measured)
			writes, ok := got["hub killed and restarted at 10100 VMs: API writes until then"]
			if r.Error != "" {
				assert.Equal(t, "not measured: "+r.Error, time.Measured)
				assert.False(t, ok, "no writes to judge")
				return
			}
			require.True(t, ok)
			assert.Equal(t, tc.quiet, writes.Met, writes.Measured)
		})
	}
}
