// Package app wires the hub: a controller-runtime manager with leader
// election, metrics and health endpoints, the safe-start gate, and the
// controllers, sharing one placement and one pool of NATS connections.
package app

import (
	"cmp"
	"context"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/crossplane/crossplane-runtime/v2/pkg/controller"
	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/event"
	"github.com/crossplane/crossplane-runtime/v2/pkg/feature"
	"github.com/crossplane/crossplane-runtime/v2/pkg/gate"
	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
	"github.com/crossplane/crossplane-runtime/v2/pkg/ratelimiter"
	"github.com/crossplane/crossplane-runtime/v2/pkg/reconciler/customresourcesgate"
	"github.com/crossplane/crossplane-runtime/v2/pkg/reconciler/managed"

	"github.com/virtfleet/virtfleet/apis"
	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/apiwrites"
	"github.com/virtfleet/virtfleet/hub/internal/backuplocation"
	"github.com/virtfleet/virtfleet/hub/internal/census"
	hubcontroller "github.com/virtfleet/virtfleet/hub/internal/controller"
	"github.com/virtfleet/virtfleet/hub/internal/controller/backup"
	"github.com/virtfleet/virtfleet/hub/internal/controller/backupgc"
	"github.com/virtfleet/virtfleet/hub/internal/controller/backupschedule"
	"github.com/virtfleet/virtfleet/hub/internal/controller/backupverification"
	"github.com/virtfleet/virtfleet/hub/internal/controller/hypervisornode"
	"github.com/virtfleet/virtfleet/hub/internal/controller/migration"
	"github.com/virtfleet/virtfleet/hub/internal/controller/providerconfig"
	"github.com/virtfleet/virtfleet/hub/internal/controller/restore"
	"github.com/virtfleet/virtfleet/hub/internal/controller/snapshot"
	"github.com/virtfleet/virtfleet/hub/internal/controller/virtualmachine"
	"github.com/virtfleet/virtfleet/hub/internal/controller/volume"
	"github.com/virtfleet/virtfleet/hub/internal/fabric"
	"github.com/virtfleet/virtfleet/hub/internal/fleet"
	"github.com/virtfleet/virtfleet/hub/internal/intern"
	"github.com/virtfleet/virtfleet/hub/internal/ipam"
	"github.com/virtfleet/virtfleet/hub/internal/perobject"
	"github.com/virtfleet/virtfleet/hub/internal/placement"
	"github.com/virtfleet/virtfleet/hub/internal/quota"
	"github.com/virtfleet/virtfleet/hub/internal/subresources"
	"github.com/virtfleet/virtfleet/hub/internal/wake"
	vfmetrics "github.com/virtfleet/virtfleet/internal/metrics"
	"github.com/virtfleet/virtfleet/internal/natswire"
	"github.com/virtfleet/virtfleet/internal/version"
)

// Config of the hub.
type Config struct {
	// Rest reaches the Kubernetes API server.
	Rest *rest.Config
	// Debug turns on debug logging, controller-runtime's included.
	Debug bool
	// LogOutput receives the logs; nil means stderr.
	LogOutput io.Writer

	LeaderElection bool
	// LeaderElectionNamespace is where the lease lives; empty means the
	// namespace the hub runs in.
	LeaderElectionNamespace string
	MetricsAddress          string
	HealthAddress           string
	// PprofAddress serves Go's profiles; empty serves none.
	PprofAddress string

	// SyncInterval re-lists every resource; PollInterval re-observes each
	// one. Reports reach status at once without either.
	SyncInterval time.Duration
	PollInterval time.Duration
	// MaxReconcileRate bounds reconciles per second across all controllers;
	// it must cover bursts of creates (see DefaultMaxReconcileRate).
	MaxReconcileRate int
	// Workers is how many reconciles each controller runs at once.
	Workers int
	// QPS bounds the API client's requests per second; Burst is twice it.
	QPS int
	// PollsPerSecond bounds each managed controller's drift polls
	// (wake.Polls): with more objects than PollInterval times it, each is
	// polled less often. 0 means wake.DefaultPollsPerSecond.
	PollsPerSecond float64
	// NormalEventsPerSecond is the budget of Normal events the hub records
	// (apiwrites.EventBudget), with bursts of ten times as many; Warning
	// events, and a VM's RestartedElsewhere, are always recorded. 0 means
	// apiwrites.DefaultNormalEventsPerSecond; below 0 records every one.
	NormalEventsPerSecond float64
	// FencingTimeout finalizes a VM, Volume or snapshot deleted while its
	// node is lost.
	FencingTimeout time.Duration
	// FencingMargin is what a VM with availability Restart waits beyond
	// its lost node's lease before it is restarted on another node.
	FencingMargin time.Duration
	// MigrationsPerFleet, MigrationsPerNode and MigrationsPerNamespace
	// bound the live migrations under way at once in a fleet, from or to
	// one node and in one namespace; zero takes migration's defaults.
	MigrationsPerFleet, MigrationsPerNode, MigrationsPerNamespace int
	// NodeTTL is the heartbeat bucket's TTL when the hub creates it.
	NodeTTL time.Duration
	// BucketMaxBytes bounds the intents bucket, NodesBucketMaxBytes the
	// nodes bucket, and NodeReportKeys and NodeReportBytes the reports of
	// each node; 0 means natswire's defaults.
	BucketMaxBytes, NodesBucketMaxBytes int64
	NodeReportKeys, NodeReportBytes     int64
	// IntentBytesPerNamespace bounds what the intents of one namespace's
	// VMs take of the intents bucket; 0 means a quarter of BucketMaxBytes.
	IntentBytesPerNamespace int64
	// StraySweep is how often the hub deletes the intents no VM binds
	// (virtualmachine.Strays); 0 means virtualmachine.DefaultStraySweep.
	StraySweep time.Duration

	// APIAddress serves the aggregated API (hub/internal/subresources);
	// empty or "0" serves none.
	APIAddress string
	// APITLSSecret ("namespace/name") holds its serving certificate.
	APITLSSecret string
	// APISessions bounds the console sessions it relays at once; 0 means
	// subresources.DefaultSessions.
	APISessions int
	// APISessionsPerNamespace bounds those of one namespace among them;
	// 0 means subresources.DefaultSessionsPerNamespace.
	APISessionsPerNamespace int
}

// Limits of the hub, sized for a machine where the API server, etcd, the
// hub, NATS and every agent share the cores, so they hold when the hub
// does not have a machine to itself.
const (
	// DefaultMaxReconcileRate: a VM created in a burst costs about five
	// reconciles (the VM once bound to its node and once at its node's
	// report, its Volume once bound and once or twice at reports). The
	// rate is set above what a burst at the control plane's own limit (a
	// plain client making the same writes per VM) needs, so that it never
	// paces a burst; it stays as a guard against a controller spinning.
	// It does pace a hub's start, which observes every object once, about
	// two per VM (the VM and its Volume), writing nothing that did not
	// change, after listing them all: with ten seconds of the rate in its
	// bucket (ratelimiter.NewGlobal), the rate is set so that a new hub
	// observes a fleet of a hundred thousand VMs in well under half of the
	// five minutes a restart may take, the rest left to the listing.
	// Writes are bounded apart from it (DefaultQPS).
	DefaultMaxReconcileRate = 2000
	// DefaultWorkers: by Little's law, the reconciles in flight per busy
	// controller are the goal's reconcile rate times how long a reconcile
	// takes in a burst on a loaded machine (its writes, each waiting for
	// the cache to show it). Many more workers
	// than that put hundreds of writes in flight at once: the API server
	// answers 429 and conflicts grow.
	DefaultWorkers = 64
	// DefaultQPS: the hub's writes are about three per VM for the VM and
	// three for its Volume; reads come from the cache. The limit is close
	// to what the API server takes, so asking for more only queues there.
	DefaultQPS = 600
)

// ShutdownTimeout bounds how long a stopping hub waits for its controllers
// and servers before it releases the leader election Lease and exits.
const ShutdownTimeout = 10 * time.Second

// Run runs the hub until ctx is done.
func Run(ctx context.Context, c Config) error {
	if c.FencingMargin < 0 {
		// A VM would start elsewhere before its old copy is fenced.
		return errors.Errorf("--fencing-margin must not be negative, got %s", c.FencingMargin)
	}
	out := c.LogOutput
	if out == nil {
		out = os.Stderr
	}
	zl := newLogger(c.Debug, out)
	log := logging.NewLogrLogger(zl.WithName("hub"))
	if c.Debug {
		ctrl.SetLogger(zl)
	} else {
		// controller-runtime's own lines only at debug level; discarded,
		// its per-request loggers cost nothing either.
		ctrl.SetLogger(logr.Discard())
	}

	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, apis.AddToScheme, apiextensionsv1.AddToScheme, apiregistrationv1.AddToScheme} {
		if err := add(scheme); err != nil {
			return errors.Wrap(err, "cannot build the scheme")
		}
	}
	watchErrs := newWatchErrors(log, scheme)
	lease, renew := 60*time.Second, 50*time.Second
	// A stopping hub gives up the Lease once its runnables stopped, so the
	// next hub leads at once instead of after the Lease expires; waiting
	// for the runnables is bounded well inside a pod's termination grace
	// (30 s by default), or the kubelet kills the hub before it releases.
	shutdown := ShutdownTimeout
	c.MaxReconcileRate = cmp.Or(c.MaxReconcileRate, DefaultMaxReconcileRate)
	c.Workers, c.QPS = cmp.Or(c.Workers, DefaultWorkers), cmp.Or(c.QPS, DefaultQPS)
	rest := ratelimiter.LimitRESTConfig(c.Rest, c.MaxReconcileRate)
	rest.QPS, rest.Burst = float32(c.QPS), 2*c.QPS
	mgr, err := ctrl.NewManager(rest, ctrl.Options{
		Scheme: scheme,
		// The hub never reads managedFields (status writes are compared by
		// status, updates leave them out and the API server keeps them):
		// stripping them shrinks every cached object, and with the caches
		// the hub's memory. The strings that repeat across objects are
		// then shared (intern): with the fleet's objects in the caches,
		// the live heap sets how much the collector marks, and with the
		// memory limit, how often.
		Cache: cache.Options{
			SyncPeriod:               &c.SyncInterval,
			DefaultTransform:         intern.Transform(intern.NewTable(intern.DefaultMaxEntries), cache.TransformStripManagedFields(), v1alpha1.AnnotationNode, ipam.LabelNetwork),
			DefaultWatchErrorHandler: watchErrs.Handle,
		},
		// Secrets are read one by one, straight from the API server: a
		// cached read would hold every Secret of the cluster in memory and
		// need list and watch on all of them.
		Client:                        client.Options{Cache: &client.CacheOptions{DisableFor: []client.Object{&corev1.Secret{}}}},
		LeaderElection:                c.LeaderElection,
		LeaderElectionID:              "virtfleet-hub",
		LeaderElectionNamespace:       c.LeaderElectionNamespace,
		LeaderElectionResourceLock:    resourcelock.LeasesResourceLock,
		LeaseDuration:                 &lease,
		RenewDeadline:                 &renew,
		LeaderElectionReleaseOnCancel: true,
		GracefulShutdownTimeout:       &shutdown,
		Metrics:                       metricsserver.Options{BindAddress: c.MetricsAddress},
		HealthProbeBindAddress:        c.HealthAddress,
		PprofBindAddress:              c.PprofAddress,
	})
	if err != nil {
		return errors.Wrap(err, "cannot create the controller manager")
	}
	// One budget of Normal events for every recorder of the hub; a VM
	// restarted elsewhere is told whatever is left of it.
	var events *apiwrites.EventBudget
	if c.NormalEventsPerSecond >= 0 {
		events = apiwrites.NewEventBudget(cmp.Or(c.NormalEventsPerSecond, apiwrites.DefaultNormalEventsPerSecond),
			string(virtualmachine.ReasonRestartedElsewhere))
	}
	recorder := event.NewAPIRecorder(apiwrites.Budget(mgr.GetEventRecorderFor("virtfleet-hub"), events)) //nolint:staticcheck // crossplane-runtime still records through the old events API
	watchErrs.reader, watchErrs.recorder = mgr.GetAPIReader(), recorder
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return errors.Wrap(err, "cannot add the health check")
	}
	if err := mgr.AddReadyzCheck("ping", healthz.Ping); err != nil {
		return errors.Wrap(err, "cannot add the ready check")
	}

	for _, m := range vfmetrics.HubObserved() {
		if err := metrics.Registry.Register(m); err != nil {
			log.Debug("Hub metric already registered", "error", err)
		}
	}
	// Counters start at zero for every reason, so that an alert's increase()
	// sees the first one counted.
	for _, r := range virtualmachine.RefusalReasons() {
		vfmetrics.PlacementRefusals.WithLabelValues(r)
	}
	for _, r := range slices.Concat(natswire.Reasons, []string{vfmetrics.ReasonForeignNode}) {
		vfmetrics.ReportsIgnored.WithLabelValues(r)
	}
	for _, r := range []string{vfmetrics.ResultSucceeded, vfmetrics.ResultFailed} {
		vfmetrics.Migrations.WithLabelValues(r)
	}
	vfmetrics.RestartsElsewhere.WithLabelValues()
	for _, r := range []string{vfmetrics.ReasonVMGone, vfmetrics.ReasonNotBound} {
		vfmetrics.StrayIntentsDeleted.WithLabelValues(r)
	}
	mrMetrics := managed.NewMRMetricRecorder()
	if err := metrics.Registry.Register(mrMetrics); err != nil {
		log.Debug("Managed resource metrics already registered", "error", err)
	}
	o := controller.Options{
		Logger:                  log,
		MaxConcurrentReconciles: c.Workers,
		PollInterval:            c.PollInterval,
		GlobalRateLimiter:       ratelimiter.NewGlobal(c.MaxReconcileRate),
		Features:                &feature.Flags{},
		Gate:                    new(gate.Gate[schema.GroupVersionKind]),
		MetricOptions:           &controller.MetricOptions{MRMetrics: mrMetrics},
	}
	o.Features.Enable(feature.EnableBetaManagementPolicies)
	if err := customresourcesgate.Setup(mgr, o); err != nil {
		return errors.Wrap(err, "cannot set up the CRD gate")
	}

	// The aggregated API writes what a user asked for at once, through the
	// plain client: the write economy below is for reconcilers.
	plain := mgr.GetClient()
	// What the hub remembers of each object goes with the object: every
	// such memory is made from memory, which watches these kinds.
	memory := perobject.NewOwner(mgr.GetCache(), &v1alpha1.VirtualMachine{}, &v1alpha1.Volume{}, &v1alpha1.DiskImage{},
		&v1alpha1.VirtualNetwork{}, &v1alpha1.VirtualMachineMigration{}, &v1alpha1.HypervisorNode{},
		&v1alpha1.VirtualMachineSnapshot{}, &v1alpha1.VirtualMachineRestore{}, &v1alpha1.VirtualMachineClone{}, &v1alpha1.VirtualMachineBackup{},
		&v1alpha1.VirtualMachineBackupVerification{}, &v1alpha1.VirtualMachineBackupSchedule{}, &v1alpha1.BackupLocation{})
	if err := mgr.Add(memory); err != nil {
		return errors.Wrap(err, "cannot add the owner of the hub's memory of objects")
	}
	mgr = apiwrites.ForManager(mgr, memory, events)
	// The placement loop hears of every fleet the pool opens; the pool
	// opens them only once the manager runs, after the loop is made below.
	var scheduler *virtualmachine.Scheduler
	notifier := wake.NewNotifier(memory)
	volumes := wake.NewNotifierFor(memory, func() client.Object { return &v1alpha1.Volume{} })
	images := wake.NewNotifierFor(memory, func() client.Object { return &v1alpha1.DiskImage{} })
	migrations := wake.NewNotifierFor(memory, func() client.Object { return &v1alpha1.VirtualMachineMigration{} })
	snapshots := wake.NewNotifierFor(memory, func() client.Object { return &v1alpha1.VirtualMachineSnapshot{} })
	restores := wake.NewNotifierFor(memory, func() client.Object { return &v1alpha1.VirtualMachineRestore{} })
	backups := wake.NewNotifierFor(memory, func() client.Object { return &v1alpha1.VirtualMachineBackup{} })
	verifications := wake.NewNotifierFor(memory, func() client.Object { return &v1alpha1.VirtualMachineBackupVerification{} })
	nodeChanges := hypervisornode.NewChanges()
	// What each node's heartbeat claims counts as its HypervisorNode
	// allows; the fleets read no heartbeat before they know it.
	allowances := fleet.NewAllowances()
	leftovers := volume.NewLeftovers(mgr.GetAPIReader(), log)
	if err := leftovers.Setup(ctx, mgr); err != nil {
		return err
	}
	pool := fleet.NewPool(ctx, log, recorder, natswire.BucketConfig{
		NodeTTL: c.NodeTTL, MaxBytes: c.BucketMaxBytes, NodesMaxBytes: c.NodesBucketMaxBytes,
		NodeReportKeys: c.NodeReportKeys, NodeReportBytes: c.NodeReportBytes,
	}, func(f *fleet.Fleet) {
		f.WithAllowances(allowances)
		f.Guests.Subscribe(notifier.Notify)
		f.Guests.Subscribe(migrations.Notify)
		f.Guests.Subscribe(restores.Notify)
		f.Snapshots.Subscribe(snapshots.Notify)
		f.Backups.Subscribe(backups.Notify)
		f.SubscribeNodes(func(node string) { scheduler.RetryUnplaced(node) })
		f.SubscribeSynced(func() { scheduler.RetryUnplaced("") })
		f.Volumes.Subscribe(volumes.Notify)
		f.Images.Subscribe(images.Notify)
		f.Images.Subscribe(scheduler.RetryImage)
		f.SubscribeNodeChanges(nodeChanges.Notify)
		leftovers.Watch(f)
		go fabric.New(f, f.Bus, log).Run(ctx, fabric.DefaultEvery)
	})
	// A hub restarted in the same process (tests do) counts its own fleet.
	fleetCensus := census.New(mgr.GetCache(), pool.Fleets, mgr.Elected(), log)
	if err := metrics.Registry.Register(fleetCensus); err != nil {
		return errors.Wrap(err, "cannot register the fleet's gauges")
	}
	defer metrics.Registry.Unregister(fleetCensus)
	placer := placement.New()
	// A reservation held for a VM, or a migration's target, goes with it.
	memory.OnForget(func(uid types.UID) { placer.Release(string(uid)) })
	quotas := quota.NewCounter(mgr.GetCache(), pool.Fleets)
	// So is a quota admission of a VM that went before it was bound.
	memory.OnForget(quotas.Forget)
	scheduler = virtualmachine.NewScheduler(apiwrites.Direct(mgr.GetClient()), mgr.GetCache(), pool, placer, quotas,
		event.NewAPIRecorder(mgr.GetEventRecorderFor("virtualmachine-scheduler")), log, //nolint:staticcheck // crossplane-runtime still records through the old events API
		o.Features.Enabled(feature.EnableBetaManagementPolicies))
	// The allocator reads through the cache, and asks the API server itself
	// only about an address the cache does not show yet.
	direct, err := client.New(mgr.GetConfig(), client.Options{Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper()})
	if err != nil {
		return errors.Wrap(err, "cannot make the address allocator's client")
	}
	addresses := ipam.New(direct, mgr.GetClient())
	vo := virtualmachine.Options{Pool: pool, Placer: placer, Scheduler: scheduler, Quotas: quotas, Notifier: notifier, FencingTimeout: c.FencingTimeout, FencingMargin: c.FencingMargin, Addresses: addresses, Memory: memory, StraySweep: c.StraySweep,
		IntentBytesPerNamespace: cmp.Or(c.IntentBytesPerNamespace, cmp.Or(c.BucketMaxBytes, natswire.DefaultMaxBytes)/4),
		Polls:                   wake.NewPolls(mgr.GetCache(), cmp.Or(c.PollsPerSecond, wake.DefaultPollsPerSecond))}
	mo := migration.Options{Pool: pool, Placer: placer, Notifier: migrations, PerFleet: c.MigrationsPerFleet, PerNode: c.MigrationsPerNode, PerNamespace: c.MigrationsPerNamespace}
	so := snapshot.Options{Pool: pool, Notifier: snapshots, FencingTimeout: c.FencingTimeout, Memory: memory, Quotas: quotas}
	ro := restore.Options{Pool: pool, Notifier: restores}
	collections := backuplocation.NewCollections()
	bo := backup.Options{Pool: pool, Notifier: backups, Memory: memory, FencingTimeout: c.FencingTimeout, Collections: collections}
	bvo := backupverification.Options{Notifier: verifications, Memory: memory}
	bso := backupschedule.Options{Clock: clock.RealClock{}, Memory: memory}
	gco := backupgc.Options{Clock: clock.RealClock{}, Memory: memory, Collections: collections, AfterDelete: backupgc.DefaultAfterDelete}
	if err := hubcontroller.SetupGated(ctx, mgr, o, vo, mo, so, ro, bo, bvo, bso, gco, volumes, images, nodeChanges, allowances); err != nil {
		return errors.Wrap(err, "cannot set up the controllers")
	}
	if err := serveSubresources(mgr, plain, pool, c, log, recorder); err != nil {
		return err
	}
	// Connect at start, not at the first VM: agents heartbeat only once the
	// buckets exist.
	if err := providerconfig.SetupConnectors(mgr, o, pool); err != nil {
		return errors.Wrap(err, "cannot set up the NATS connectors")
	}
	log.Info("Hub starting", "version", version.Get(), "leaderElection", c.LeaderElection, "maxReconcileRate", c.MaxReconcileRate, "workers", c.Workers, "qps", c.QPS)
	return errors.Wrap(mgr.Start(ctx), "controller manager stopped")
}

// serveSubresources adds the aggregated API server to mgr, when c asks for
// one.
func serveSubresources(mgr ctrl.Manager, kube client.Client, pool *fleet.Pool, c Config, log logging.Logger, recorder event.Recorder) error {
	if c.APIAddress == "" || c.APIAddress == "0" {
		return nil
	}
	ns, name, ok := strings.Cut(c.APITLSSecret, "/")
	if !ok || ns == "" || name == "" {
		return errors.Errorf("the aggregated API's TLS Secret %q is not namespace/name", c.APITLSSecret)
	}
	configs := providerconfig.NewResolver(kube)
	fleets := func(ctx context.Context, vm *v1alpha1.VirtualMachine) (*fleet.Fleet, error) {
		pc, err := configs.Resolve(ctx, vm)
		if err != nil {
			return nil, err
		}
		return pool.Get(ctx, pc.Target)
	}
	o := subresources.Options{Address: c.APIAddress, TLSSecret: types.NamespacedName{Namespace: ns, Name: name}, Sessions: c.APISessions, SessionsPerNamespace: c.APISessionsPerNamespace}
	srv := subresources.New(o, kube, mgr.GetAPIReader(), fleets, log.WithValues("server", "subresources"), recorder)
	return errors.Wrap(mgr.Add(srv), "cannot add the aggregated API server")
}
