package benchmark

import (
	"encoding/json"
	"os"
	"path/filepath"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
)

// Result is one run of the benchmark, as written to bench/results.
type Result struct {
	Date    time.Time `json:"date"`
	Commit  string    `json:"commit"`
	Dirty   bool      `json:"dirty"`
	Machine Machine   `json:"machine"`
	// Quick is true for the harness's own small run.
	Quick bool `json:"quick"`
	// Scenarios are those the run was asked for (Options.Only and the
	// flags pick them).
	Scenarios []string `json:"scenarios,omitempty"`
	// Stopped says why the run ended before its last scenario; the
	// scenarios before it are in the result.
	Stopped string `json:"stopped,omitempty"`
	// Density is VMs created one by one at an interval.
	Density *Scenario `json:"density,omitempty"`
	// Bursts are VMs created all at once, one scenario per size; the
	// largest is the burst.
	Bursts []Scenario `json:"bursts"`
	// Scale are bursts over simulated nodes (agent/simnodes), one per
	// size: the hub and the control plane at fleet sizes this machine
	// cannot run agents and libvirtds for.
	Scale []Scenario `json:"scale,omitempty"`
	// Guest is one real guest's boot, beside the test driver's figures.
	Guest *GuestBoot `json:"guest,omitempty"`
	// Snapshots are that guest's snapshots, disk-only and with memory,
	// and a restore of the one with memory.
	Snapshots *GuestSnapshots `json:"snapshots,omitempty"`
	// Backup is that guest's backups, beside a raw upload to the same
	// store, and a restore from them.
	Backup *GuestBackup `json:"backup,omitempty"`
	// Migration is one real guest's live migration between two hosts.
	Migration *MigrationRun `json:"migration,omitempty"`
	// Idle is one node of many guests: its full observe, and its agent's
	// CPU while nothing changes (idle.go).
	Idle *Idle `json:"idle,omitempty"`
	// DenseNodes are single nodes of the most guests: a simulated one and
	// one on the test driver, each as Idle measures it (idle.go).
	DenseNodes []Idle   `json:"denseNodes,omitempty"`
	Targets    []Target `json:"targets"`
}

// Machine is where the run happened; the numbers mean little without it.
type Machine struct {
	CPUs          int    `json:"cpus"`
	MemoryBytes   int64  `json:"memoryBytes"`
	Kernel        string `json:"kernel"`
	GoVersion     string `json:"goVersion"`
	LoadAvgBefore string `json:"loadAvgBefore"`
}

// Scenario is what one scenario measured on its own fresh stack.
type Scenario struct {
	Name  string `json:"name"`
	VMs   int    `json:"vms"`
	Nodes int    `json:"nodes"`
	// IntervalSeconds between creates; 0 for a burst.
	IntervalSeconds float64 `json:"intervalSeconds"`
	// Running is how many VMs were seen Running before the timeout.
	Running int `json:"running"`
	// PerNode is how many VMs ended up on each node.
	PerNode map[string]int `json:"perNode"`
	// AddressedVMs is how many VMs show an address on every interface;
	// DuplicateAddresses how many addresses of a network more than one VM
	// shows (each VM beyond the first counts once), which must be 0.
	AddressedVMs       int `json:"addressedVMs"`
	DuplicateAddresses int `json:"duplicateAddresses"`
	// Latency is from each Create call's return to the first watch event
	// showing the VM Running.
	Latency Latency `json:"latency"`
	// CreateToPlaced and PlacedToRunning split Latency where the hub hands
	// over to the node: the first watch event showing the node annotation
	// the hub writes just before it publishes the intent.
	CreateToPlaced  Latency `json:"createToPlaced"`
	PlacedToRunning Latency `json:"placedToRunning"`
	// WallSeconds is from the first Create call to the last VM Running.
	WallSeconds  float64 `json:"wallSeconds"`
	VMsPerSecond float64 `json:"vmsPerSecond"`
	// Stalls are the burst's gaps with no VM reaching Running while placed
	// VMs waited; Timeline its counts second by second, to see them.
	Stalls   Stalls          `json:"stalls"`
	Timeline []TimelinePoint `json:"timeline,omitempty"`

	// VMWritesPerVM counts writes to virtualmachines (and subresources),
	// the benchmark's own Create included, from before the first create
	// until the run settled after the last VM was Running.
	VMWritesPerVM float64 `json:"vmWritesPerVM"`
	// Writes breaks down every write to virtfleet's group and to events.
	Writes []RequestCount `json:"writes"`
	// OtherRequests are the API server's other requests, reads included,
	// from every client, of at least minOtherPerVM per VM: what else the
	// API server spent the run on.
	OtherRequests []RequestCount `json:"otherRequests,omitempty"`

	HubPeakRSSBytes        int64   `json:"hubPeakRSSBytes"`
	HubCPUSeconds          float64 `json:"hubCPUSeconds"`
	HubCPUSecondsPer1000VM float64 `json:"hubCPUSecondsPer1000VMs"`
	// Agent is node1's agent; AgentMax the largest of all agents.
	AgentPeakRSSBytes    int64   `json:"agentPeakRSSBytes"`
	AgentMaxPeakRSSBytes int64   `json:"agentMaxPeakRSSBytes"`
	AgentCPUSeconds      float64 `json:"agentCPUSeconds"`
	// CPU is the machine's CPU time from the first create until every VM
	// ran (or the timeout), and who used it.
	CPU CPUShare `json:"cpu"`

	// The limits, measured on the same stack after virtfleet's run.
	RawLibvirt   *Limit `json:"rawLibvirt,omitempty"`
	ControlPlane *Limit `json:"controlPlane,omitempty"`
	// WholeFlow is the API server's limit for every write of a VM's flow
	// (see wholeFlow), not only the VM's own.
	WholeFlow *Limit `json:"wholeFlow,omitempty"`
	// Ratios of virtfleet's VMs/s to each limit's.
	RatioToRawLibvirt   float64 `json:"ratioToRawLibvirt,omitempty"`
	RatioToControlPlane float64 `json:"ratioToControlPlane,omitempty"`
	RatioToWholeFlow    float64 `json:"ratioToWholeFlow,omitempty"`

	// Footprint is the control plane's, NATS's and the buckets' share of
	// the fleet once every VM ran.
	Footprint *Footprint `json:"footprint,omitempty"`

	// HubRestart is the hub killed and started again once the VMs of a
	// burst over simulated nodes all ran (restart.go).
	HubRestart *HubRestart `json:"hubRestart,omitempty"`

	// Notes say what was changed to make the scenario fit, or what failed.
	Notes []string `json:"notes,omitempty"`
}

// Target is one of the goals beside what was measured.
type Target struct {
	Name     string `json:"name"`
	Goal     string `json:"goal"`
	Measured string `json:"measured"`
	Met      bool   `json:"met"`
}

// Write stores r as <dir>/<stamp>.json and .md and returns both paths.
func Write(r *Result, dir string) (string, string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", "", errors.Wrap(err, "cannot create the results directory")
	}
	base := filepath.Join(dir, r.Date.UTC().Format("2006-01-02T15-04-05Z"))
	js, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return "", "", errors.Wrap(err, "cannot encode the result")
	}
	if err := os.WriteFile(base+".json", append(js, '\n'), 0o644); err != nil {
		return "", "", errors.Wrap(err, "cannot write the JSON result")
	}
	if err := os.WriteFile(base+".md", []byte(Markdown(r)), 0o644); err != nil {
		return "", "", errors.Wrap(err, "cannot write the Markdown result")
	}
	return base + ".md", base + ".json", nil
}

// Read loads a result written by Write.
func Read(path string) (*Result, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, errors.Wrap(err, "cannot read the result")
	}
	r := &Result{}
	return r, errors.Wrap(json.Unmarshal(b, r), "cannot decode the result")
}
