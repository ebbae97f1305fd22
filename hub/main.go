// Command hub is virtfleet's Crossplane provider: it reconciles
// VirtualMachines, Volumes, VirtualNetworks, DiskImages and the VMs'
// snapshots and restores into intents for the nodes' agents. See hub/internal/app. Every flag can also be set by its
// environment variable, VIRTFLEET_ and the flag's name
// (--fencing-timeout: VIRTFLEET_FENCING_TIMEOUT), as for every virtfleet
// command (internal/flagenv).
package main

import (
	"flag"
	"fmt"
	"os"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/virtfleet/virtfleet/hub/internal/apiwrites"
	"github.com/virtfleet/virtfleet/hub/internal/app"
	"github.com/virtfleet/virtfleet/hub/internal/controller/migration"
	"github.com/virtfleet/virtfleet/hub/internal/controller/virtualmachine"
	"github.com/virtfleet/virtfleet/hub/internal/subresources"
	"github.com/virtfleet/virtfleet/hub/internal/wake"
	"github.com/virtfleet/virtfleet/internal/flagenv"
	"github.com/virtfleet/virtfleet/internal/memlimit"
	"github.com/virtfleet/virtfleet/internal/natswire"
)

func main() {
	var c app.Config
	flag.BoolVar(&c.Debug, "debug", false, "Log at debug level, controller-runtime included.")
	flag.BoolVar(&c.LeaderElection, "leader-election", false, "Elect a leader among hub replicas (a Lease).")
	flag.StringVar(&c.LeaderElectionNamespace, "leader-election-namespace", "", "Namespace of the leader election Lease; empty means the hub's own.")
	flag.StringVar(&c.MetricsAddress, "metrics-bind-address", ":8080", "Address of the Prometheus metrics endpoint; 0 disables it.")
	flag.StringVar(&c.HealthAddress, "health-probe-bind-address", ":8081", "Address of the /healthz and /readyz endpoints; 0 disables them.")
	flag.StringVar(&c.PprofAddress, "pprof-bind-address", "", "Address of Go's /debug/pprof profiles, for finding where memory and CPU go; empty disables it.")
	flag.DurationVar(&c.SyncInterval, "sync", time.Hour, "How often every resource is listed again.")
	flag.DurationVar(&c.PollInterval, "poll", time.Minute, "How often each resource is checked for drift; reports update status at once regardless.")
	flag.Float64Var(&c.PollsPerSecond, "polls-per-second", wake.DefaultPollsPerSecond, "Drift checks each kind's controller makes per second at most: with more resources than --poll times this, each is checked less often than --poll, so checks never crowd out new work.")
	flag.IntVar(&c.MaxReconcileRate, "max-reconcile-rate", app.DefaultMaxReconcileRate, "Reconciles per second across all controllers; high enough for bursts of creates.")
	flag.IntVar(&c.Workers, "workers", app.DefaultWorkers, "Reconciles each controller runs at once.")
	flag.IntVar(&c.QPS, "qps", app.DefaultQPS, "Requests per second to the Kubernetes API server (burst: twice as many).")
	flag.Float64Var(&c.NormalEventsPerSecond, "normal-events-per-second", apiwrites.DefaultNormalEventsPerSecond, "Normal events the hub records per second (bursts of ten times as many); more are dropped and counted, so a burst of creates does not cost a write per VM in events. Warning events are always recorded. Below 0 records every one.")
	flag.IntVar(&c.MigrationsPerFleet, "migrations-per-fleet", migration.DefaultPerFleet, "Live migrations under way at once in one fleet (one NATS server's nodes).")
	flag.IntVar(&c.MigrationsPerNode, "migrations-per-node", migration.DefaultPerNode, "Live migrations under way at once from or to one node.")
	flag.IntVar(&c.MigrationsPerNamespace, "migrations-per-namespace", migration.DefaultPerNamespace, "Live migrations under way at once in one namespace, so that no one tenant takes every slot of the fleet.")
	flag.DurationVar(&c.FencingTimeout, "fencing-timeout", 60*time.Second, "How long a VM, Volume or snapshot deleted while its node is lost waits before it is finalized.")
	flag.DurationVar(&c.FencingMargin, "fencing-margin", virtualmachine.DefaultFencingMargin, "What a VM with availability Restart waits, beyond its lost node's lease (the agent's --fence-after), before it is restarted on another node: at least the drift between the hub's and the nodes' clocks over a lease.")
	flag.DurationVar(&c.StraySweep, "stray-sweep-interval", virtualmachine.DefaultStraySweep, "How often the hub deletes the intents no VirtualMachine binds to their node (a VM whose finalizer was removed by hand, a binding edited by hand), and so their guests.")
	flag.DurationVar(&c.NodeTTL, "node-ttl", natswire.DefaultNodeTTL, "TTL of node heartbeats when the hub creates the buckets.")
	flag.Int64Var(&c.BucketMaxBytes, "nats-bucket-max-bytes", natswire.DefaultMaxBytes, "Bytes the intents bucket may store (on every server holding a replica); past it NATS refuses its writes. The hub applies it at every start.")
	flag.Int64Var(&c.NodeReportKeys, "nats-node-report-keys", natswire.DefaultNodeReportKeys, "Report keys one node may hold (its guests, volumes, images, snapshots, and deleted ones for an hour); past it NATS refuses the node's new reports, and no other node's. Applied as --nats-bucket-max-bytes is.")
	flag.Int64Var(&c.NodeReportBytes, "nats-node-report-bytes", natswire.DefaultNodeReportBytes, "Bytes one node's reports may take (on every server holding a replica, for every node); past it NATS refuses the node's new reports, and no other node's. Applied as --nats-bucket-max-bytes is.")
	flag.Int64Var(&c.IntentBytesPerNamespace, "intent-bytes-per-namespace", 0, "Bytes the intents of one namespace's VMs may take of the intents bucket, so that no one tenant fills it; a VM whose intent would take its namespace past it is not published until the namespace's other VMs shrink or go. 0 means a quarter of --nats-bucket-max-bytes.")
	flag.Int64Var(&c.NodesBucketMaxBytes, "nats-nodes-bucket-max-bytes", natswire.DefaultNodesMaxBytes, "Bytes the nodes bucket (heartbeats) may store; applied as --nats-bucket-max-bytes is.")
	flag.StringVar(&c.APIAddress, "api-bind-address", "0", "Address of the aggregated API (subresources.virtfleet.io: console, vnc, start, stop, restart, reset, pause, unpause, migrate); 0 disables it.")
	flag.StringVar(&c.APITLSSecret, "api-tls-secret", "virtfleet-system/virtfleet-hub-api-tls", "Secret (namespace/name) with the aggregated API's serving certificate; the hub creates and renews it.")
	flag.IntVar(&c.APISessions, "api-console-sessions", subresources.DefaultSessions, "Console and VNC sessions one hub replica relays at once.")
	flag.IntVar(&c.APISessionsPerNamespace, "api-console-sessions-per-namespace", subresources.DefaultSessionsPerNamespace, "Console and VNC sessions one hub replica relays at once for the VMs of one namespace, so that no one tenant takes every session.")
	// The names Crossplane providers read besides (provider-template's
	// LEADER_ELECTION), and the downward-API namespace cluster/deploy sets.
	also := map[string][]string{"leader-election": {"LEADER_ELECTION"}, "leader-election-namespace": {"POD_NAMESPACE"}}
	memoryLimit := memlimit.Flag(flag.CommandLine)
	if err := flagenv.Parse(flag.CommandLine, os.Args[1:], os.LookupEnv, also); err != nil {
		fmt.Fprintln(os.Stderr, "hub:", err)
		os.Exit(2)
	}
	memlimit.Apply(*memoryLimit, os.LookupEnv)

	var err error
	if c.Rest, err = ctrl.GetConfig(); err != nil {
		fmt.Fprintln(os.Stderr, "hub: cannot find the Kubernetes API server:", err)
		os.Exit(1)
	}
	if err := app.Run(ctrl.SetupSignalHandler(), c); err != nil {
		fmt.Fprintln(os.Stderr, "hub:", err)
		os.Exit(1)
	}
}
