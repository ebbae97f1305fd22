// Package app wires the hub: a controller-runtime manager with leader
// election, metrics and health endpoints, the safe-start gate, and the
// controllers, sharing one placement and one pool of NATS connections.
package app

import (
	"context"
	"io"
	"os"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
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
	hubcontroller "github.com/virtfleet/virtfleet/hub/internal/controller"
	"github.com/virtfleet/virtfleet/hub/internal/controller/providerconfig"
	"github.com/virtfleet/virtfleet/hub/internal/controller/virtualmachine"
	"github.com/virtfleet/virtfleet/hub/internal/controller/volume"
	"github.com/virtfleet/virtfleet/hub/internal/fleet"
	"github.com/virtfleet/virtfleet/hub/internal/kubeclient"
	"github.com/virtfleet/virtfleet/hub/internal/placement"
	"github.com/virtfleet/virtfleet/internal/natswire"
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

	// SyncInterval re-lists every resource; PollInterval re-observes each
	// one. Reports reach status at once without either.
	SyncInterval time.Duration
	PollInterval time.Duration
	// MaxReconcileRate bounds reconciles per second across all controllers,
	// and the API client's rate; it must cover bursts of creates.
	MaxReconcileRate int
	// FencingTimeout finalizes a VM deleted while its node is lost.
	FencingTimeout time.Duration
	// NodeTTL is the heartbeat bucket's TTL when the hub creates it.
	NodeTTL time.Duration
}

// Run runs the hub until ctx is done.
func Run(ctx context.Context, c Config) error {
	out := c.LogOutput
	if out == nil {
		out = os.Stderr
	}
	zl := zap.New(zap.UseDevMode(c.Debug), zap.WriteTo(out))
	log := logging.NewLogrLogger(zl.WithName("hub"))
	if c.Debug {
		ctrl.SetLogger(zl)
	} else {
		ctrl.SetLogger(zap.New(zap.WriteTo(io.Discard)))
	}

	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, apis.AddToScheme, apiextensionsv1.AddToScheme} {
		if err := add(scheme); err != nil {
			return errors.Wrap(err, "cannot build the scheme")
		}
	}
	lease, renew := 60*time.Second, 50*time.Second
	mgr, err := ctrl.NewManager(ratelimiter.LimitRESTConfig(c.Rest, c.MaxReconcileRate), ctrl.Options{
		Scheme: scheme,
		Cache:  cache.Options{SyncPeriod: &c.SyncInterval},
		// Secrets are read one by one, straight from the API server: a
		// cached read would hold every Secret of the cluster in memory and
		// need list and watch on all of them.
		Client:                     client.Options{Cache: &client.CacheOptions{DisableFor: []client.Object{&corev1.Secret{}}}},
		LeaderElection:             c.LeaderElection,
		LeaderElectionID:           "virtfleet-hub",
		LeaderElectionNamespace:    c.LeaderElectionNamespace,
		LeaderElectionResourceLock: resourcelock.LeasesResourceLock,
		LeaseDuration:              &lease,
		RenewDeadline:              &renew,
		Metrics:                    metricsserver.Options{BindAddress: c.MetricsAddress},
		HealthProbeBindAddress:     c.HealthAddress,
	})
	if err != nil {
		return errors.Wrap(err, "cannot create the controller manager")
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return errors.Wrap(err, "cannot add the health check")
	}
	if err := mgr.AddReadyzCheck("ping", healthz.Ping); err != nil {
		return errors.Wrap(err, "cannot add the ready check")
	}

	mrMetrics := managed.NewMRMetricRecorder()
	if err := metrics.Registry.Register(mrMetrics); err != nil {
		log.Debug("Managed resource metrics already registered", "error", err)
	}
	o := controller.Options{
		Logger:                  log,
		MaxConcurrentReconciles: c.MaxReconcileRate,
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

	mgr = kubeclient.ForManager(mgr)
	// The placement loop hears of every fleet the pool opens; the pool
	// opens them only once the manager runs, after the loop is made below.
	var scheduler *virtualmachine.Scheduler
	notifier := fleet.NewNotifier()
	volumes := fleet.NewNotifierFor(func() client.Object { return &v1alpha1.Volume{} })
	images := fleet.NewNotifierFor(func() client.Object { return &v1alpha1.DiskImage{} })
	leftovers := volume.NewLeftovers(mgr.GetClient(), mgr.GetAPIReader(), log)
	if err := leftovers.Setup(ctx, mgr); err != nil {
		return err
	}
	recorder := event.NewAPIRecorder(mgr.GetEventRecorderFor("virtfleet-hub")) //nolint:staticcheck // crossplane-runtime still records through the old events API
	pool := fleet.NewPool(ctx, log, recorder, natswire.BucketConfig{NodeTTL: c.NodeTTL}, func(f *fleet.Fleet) {
		f.Subscribe(notifier.Notify)
		f.SubscribeNodes(func(node string) { scheduler.RetryUnplaced(node) })
		f.SubscribeVolumes(volumes.Notify)
		f.SubscribeImages(images.Notify)
		leftovers.Watch(f)
	})
	placer := placement.New()
	scheduler = virtualmachine.NewScheduler(kubeclient.Direct(mgr.GetClient()), mgr.GetCache(), pool, placer,
		event.NewAPIRecorder(mgr.GetEventRecorderFor("virtualmachine-scheduler")), log, //nolint:staticcheck // crossplane-runtime still records through the old events API
		o.Features.Enabled(feature.EnableBetaManagementPolicies))
	vo := virtualmachine.Options{Pool: pool, Placer: placer, Scheduler: scheduler, Notifier: notifier, FencingTimeout: c.FencingTimeout}
	if err := hubcontroller.SetupGated(ctx, mgr, o, vo, volumes, images); err != nil {
		return errors.Wrap(err, "cannot set up the controllers")
	}
	// Connect at start, not at the first VM: agents heartbeat only once the
	// buckets exist.
	if err := providerconfig.SetupConnectors(mgr, o, pool); err != nil {
		return errors.Wrap(err, "cannot set up the NATS connectors")
	}
	log.Info("Hub starting", "leaderElection", c.LeaderElection, "maxReconcileRate", c.MaxReconcileRate)
	return errors.Wrap(mgr.Start(ctx), "controller manager stopped")
}
