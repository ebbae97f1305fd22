//go:build ignore

// Command garbage-collector runs Kubernetes' own garbage collector
// (k8s.io/kubernetes/pkg/controller/garbagecollector) and nothing else,
// wired as kube-controller-manager's startGarbageCollectorController and
// CreateControllerContext wire it: shared and metadata informers, a
// discovery-backed RESTMapper reset every 30 seconds, the default ignored
// resources, and a Sync every 30 seconds that starts monitors for resources
// that appear later (Crossplane installs its CRDs after it starts).
//
// envtest runs no kube-controller-manager, and the Crossplane harness needs
// only this controller of it, so this command builds only the part of
// kube-controller-manager's packages that controller needs. The build
// constraint keeps it out of virtfleet's module, whose Kubernetes libraries
// are newer: internal/harness/envtestassets embeds this file and builds it
// with k8s.io/kubernetes KubernetesVersion through internal/harness/modbuild.
package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/controller-manager/pkg/informerfactory"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/controller/garbagecollector"
)

// kube-controller-manager's defaults: its client's QPS and burst, its
// minimum informer resync period, the garbage collector's workers
// (--concurrent-gc-syncs), and the period of its monitor and RESTMapper
// refresh (fixed in startGarbageCollectorController).
const (
	qps        = 20
	burst      = 30
	resync     = 12 * time.Hour
	workers    = 20
	syncPeriod = 30 * time.Second
)

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the API server whose garbage to collect")
	klog.InitFlags(nil)
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *kubeconfig); err != nil {
		fmt.Fprintln(os.Stderr, "garbage-collector:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, kubeconfig string) error {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fmt.Errorf("cannot load kubeconfig: %w", err)
	}
	cfg.QPS, cfg.Burst = qps, burst
	cfg = rest.AddUserAgent(cfg, "garbage-collector")
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	if err := waitForAPIServer(ctx, client); err != nil {
		return err
	}

	// Informers drop managed fields, as kube-controller-manager's do.
	trim := func(obj any) (any, error) {
		if a, err := meta.Accessor(obj); err == nil && a.GetManagedFields() != nil {
			a.SetManagedFields(nil)
		}
		return obj, nil
	}
	sharedInformers := informers.NewSharedInformerFactoryWithOptions(client, resync, informers.WithTransform(trim))
	metadataClient, err := metadata.NewForConfig(cfg)
	if err != nil {
		return err
	}
	metadataInformers := metadatainformer.NewSharedInformerFactoryWithOptions(metadataClient, resync, metadatainformer.WithTransform(trim))
	objectOrMetadata := informerfactory.NewInformerFactory(sharedInformers, metadataInformers)

	// A RESTMapper over a cached discovery client, reset periodically so
	// that it learns new resources; the garbage collector's Sync uses a
	// discovery client of its own, as it must not share the mapper's.
	mapperDiscovery, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return err
	}
	restMapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(mapperDiscovery))
	go wait.Until(restMapper.Reset, syncPeriod, ctx.Done())
	syncDiscovery, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return err
	}

	// Each deletion takes two API calls, so the collector's own client gets
	// twice the QPS.
	gcConfig := rest.CopyConfig(cfg)
	gcConfig.QPS *= 2
	gcMetadata, err := metadata.NewForConfig(gcConfig)
	if err != nil {
		return err
	}
	informersStarted := make(chan struct{})
	graph := garbagecollector.NewDependencyGraphBuilder(ctx, metadataClient, restMapper,
		garbagecollector.DefaultIgnoredResources(), objectOrMetadata, informersStarted)
	gc, err := garbagecollector.NewComposedGarbageCollector(ctx, client, gcMetadata, restMapper, graph)
	if err != nil {
		return fmt.Errorf("cannot create the garbage collector: %w", err)
	}
	go gc.Run(ctx, workers, syncPeriod)
	go gc.Sync(ctx, syncDiscovery, syncPeriod)

	objectOrMetadata.Start(ctx.Done())
	close(informersStarted)
	<-ctx.Done()
	return nil
}

// waitForAPIServer waits until the API server answers /healthz, as
// kube-controller-manager does before it builds its controllers.
func waitForAPIServer(ctx context.Context, client kubernetes.Interface) error {
	var last error
	err := wait.PollUntilContextTimeout(ctx, time.Second, time.Minute, true, func(ctx context.Context) (bool, error) {
		var status int
		last = client.Discovery().RESTClient().Get().AbsPath("/healthz").Do(ctx).StatusCode(&status).Error()
		return last == nil && status == http.StatusOK, nil
	})
	if err != nil {
		return fmt.Errorf("API server not healthy: %w (last: %v)", err, last)
	}
	return nil
}
