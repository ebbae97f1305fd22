// Command agent runs on every hypervisor node: it watches the node's intents
// on NATS, makes its guests match them through the node's backend, and
// reports what it sees. Every flag can also be set by its environment
// variable, VIRTFLEET_ and the flag's name (--nats-url: VIRTFLEET_NATS_URL),
// as for every virtfleet command (internal/flagenv).
package main

import (
	"context"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/agent/driver/imageimport"
	"github.com/virtfleet/virtfleet/agent/driver/kubevirt"
	"github.com/virtfleet/virtfleet/agent/driver/libvirt"
	"github.com/virtfleet/virtfleet/agent/driver/nova"
	"github.com/virtfleet/virtfleet/agent/internal/app"
	"github.com/virtfleet/virtfleet/agent/internal/bus"
	"github.com/virtfleet/virtfleet/internal/flagenv"
	"github.com/virtfleet/virtfleet/internal/memlimit"
	"github.com/virtfleet/virtfleet/internal/natswire"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "agent:", err)
		os.Exit(1)
	}
}

func run() error {
	fs := flag.NewFlagSet("agent", flag.ExitOnError)
	var (
		node         = fs.String("node", "", "Name of this hypervisor node.")
		labels       = fs.String("labels", "", "Node labels matched by nodeSelector, k=v,k2=v2.")
		natsURL      = fs.String("nats-url", "nats://127.0.0.1:4222", "NATS server URLs, comma-separated.")
		creds        = fs.String("nats-credentials", "", "File holding this node's nkey seed, as written by hack/mint-agent-credentials.")
		timeout      = fs.Duration("nats-timeout", bus.DefaultTimeout, "Timeout of each NATS request; a request the server refuses only times out, so keep it short.")
		backend      = fs.String("backend", driver.BackendLibvirt, "Hypervisor backend: libvirt (this host's libvirtd), nova (an OpenStack cloud) or kubevirt (a KubeVirt cluster).")
		socket       = fs.String("libvirt-socket", "", "libvirtd unix socket; empty means /run/libvirt/libvirt-sock.")
		uri          = fs.String("libvirt-uri", "", "libvirt connection URI; empty means qemu:///system.")
		pool         = fs.String("libvirt-pool", "", "Storage pool for volumes, cloud-init seeds and swap; empty means default.")
		domainType   = fs.String("libvirt-domain-type", "", "libvirt domain type of guests: empty means kvm where the host offers it, else qemu; qemu forces emulation (TCG) where KVM is offered but cannot run guests, as nested KVM often cannot; kvm refuses to start without KVM.")
		consoleDir   = fs.String("libvirt-console-dir", libvirt.DefaultConsoleDir, "Directory, as libvirtd sees it, where each guest's serial console listens on a unix socket the agent opens.")
		consoleLocal = fs.String("libvirt-console-local-dir", "", "The console directory as the agent sees it, where libvirtd runs in a mount namespace or container of its own; empty means --libvirt-console-dir.")
		netns        = fs.String("netns", "", "Path of the network namespace holding libvirtd's bridges (/run/netns/NAME), where the overlays' VXLAN devices are made; empty means the agent's own.")
		imageDir     = fs.String("image-dir", "", "This agent's own directory for image downloads until they are verified; partial downloads of a killed agent are removed at start. Empty means the system's temporary directory, never cleaned.")
		pruneEvery   = fs.Duration("image-prune-interval", 0, "How often images unused for their DiskImage's pruneAfter are removed from the node; 0 means 1m.")
		maxImage     = resource.QuantityValue{Quantity: *resource.NewQuantity(imageimport.DefaultMaxBytes, resource.BinarySI)}
		dlTimeout    = fs.Duration("image-download-timeout", imageimport.DefaultTimeout, "Longest one image download may take, from its first connection to its last byte.")
		downloads    = fs.Int("image-downloads", imageimport.DefaultDownloads, "Image downloads the node runs at once; others wait for a slot.")
		clouds       = fs.String("openstack-clouds-file", "", "nova: clouds.yaml to read; empty means the standard locations, then the OS_* environment variables.")
		cloud        = fs.String("openstack-cloud", "", "nova: the clouds.yaml entry to use; empty means OS_CLOUD.")
		region       = fs.String("openstack-region", "", "nova: region, overriding the cloud's region_name.")
		novaPoll     = fs.Duration("nova-poll-interval", 0, "nova: interval between changes-since polls of the agent's servers; 0 means 5s.")
		kvConfig     = fs.String("kubevirt-kubeconfig", "", "kubevirt: kubeconfig of the KubeVirt cluster; empty means in-cluster.")
		kvNamespace  = fs.String("kubevirt-namespace", "", "kubevirt: namespace the KubeVirt VirtualMachines are created in; empty means default.")
		kvAccessMode = fs.String("kubevirt-access-mode", "", "kubevirt: access mode of the PVCs made for disks; empty means ReadWriteOnce. KubeVirt migrates a VM live only when its PVCs are ReadWriteMany: set that where the storage class is shared.")
		grace        = fs.Duration("shutdown-grace", 0, "How long a guest may take to shut down on ACPI before it is forced off; 0 means 2m.")
		heartbeat    = fs.Duration("heartbeat-interval", 2*time.Second, "Interval between heartbeats; keep it well below the nodes bucket TTL (10s).")
		fenceAfter   = fs.Duration("fence-after", app.DefaultFenceAfter, "The node's lease: when no heartbeat has been stored for this long, the node destroys its guests that are to be restarted elsewhere (availability Restart) and starts none of them until it has stored a heartbeat and read its intents afresh. At least twice --heartbeat-interval; 0 means the node never fences itself, and the hub then never restarts its guests elsewhere.")
		sharedPools  = fs.String("shared-pools", "", "Storage pools on shared storage this node reaches (libvirt pools on NFS, say), comma-separated, each named the same on every node that reaches it; a Volume in one of them is not bound to one node.")
		resync       = fs.Duration("resync-interval", 60*time.Second, "Interval between full resyncs of every guest.")
		workers      = fs.Int("workers", 8, "Guests reconciled in parallel.")
		cpuRatio     = fs.Float64("cpu-allocation-ratio", app.DefaultCPUAllocationRatio, "vCPUs offered to placement per host CPU.")
		memoryRatio  = fs.Float64("memory-allocation-ratio", app.DefaultMemoryAllocationRatio, "Guest memory offered to placement per byte of host memory; 1 means no overcommit. Raise it on libvirt's test driver, whose hosts have 3 GiB (make run uses 4).")
		migrationURI = fs.String("migration-uri", "", "Where other nodes' hypervisors reach this node's to migrate guests here live (libvirt: a URI such as qemu+tls://HOST/system; the guest's memory and disks go to HOST); empty means the node receives no live migration.")
		consoles     = fs.Int("console-sessions", natswire.DefaultConsoleSessions, "Console sessions (serial or VNC, opened by the hub) the node serves at once; more are refused as busy.")
		consoleRate  = fs.Int("console-bytes-per-second", natswire.DefaultConsoleBytesPerSecond, "Bytes per second each console session carries in each direction.")
		metricsAddr  = fs.String("metrics-bind-address", ":8090", "Address the Prometheus metrics endpoint (/metrics) listens on; 0 serves none.")
		pprofAddr    = fs.String("pprof-bind-address", "", "Address of Go's /debug/pprof profiles, for finding where memory and CPU go; empty disables it.")
		debug        = fs.Bool("debug", false, "Log at debug level.")
	)
	fs.Var(&maxImage, "image-max-size", "Largest image download the node accepts, e.g. 64Gi; a larger one is refused.")
	var tunnel netip.Addr
	fs.TextVar(&tunnel, "tunnel-address", netip.Addr{}, "This node's address on the underlay that networks spanning nodes (VXLAN overlays) run over, announced to the other nodes; empty means none, and the node refuses such networks.")
	// ExitOnError: a bad flag exits with usage; a bad variable is returned.
	memoryLimit := memlimit.Flag(fs)
	if err := flagenv.Parse(fs, os.Args[1:], os.LookupEnv, nil); err != nil {
		return err
	}
	memlimit.Apply(*memoryLimit, os.LookupEnv)

	switch {
	case maxImage.Value() <= 0:
		return fmt.Errorf("--image-max-size must be more than 0, got %s", maxImage.String())
	case *dlTimeout <= 0:
		return fmt.Errorf("--image-download-timeout must be more than 0, got %s", *dlTimeout)
	case *downloads < 1:
		return fmt.Errorf("--image-downloads must be at least 1, got %d", *downloads)
	case *kvAccessMode != "" && *kvAccessMode != string(corev1.ReadWriteOnce) && *kvAccessMode != string(corev1.ReadWriteMany):
		return fmt.Errorf("--kubevirt-access-mode must be ReadWriteOnce or ReadWriteMany, got %q", *kvAccessMode)
	}

	log := logging.NewLogrLogger(zap.New(zap.UseDevMode(*debug)).WithName("agent"))
	lbls, err := app.ParseLabels(*labels)
	if err != nil {
		return fmt.Errorf("--labels: %w", err)
	}
	if *creds == "" {
		return fmt.Errorf("--nats-credentials is required")
	}
	seed, err := app.ReadSeed(*creds)
	if err != nil {
		return err
	}

	// One node, one set of download limits, whichever backend stores the
	// images.
	images := imageimport.Config{Dir: *imageDir, MaxBytes: maxImage.Value(), Timeout: *dlTimeout, Downloads: *downloads}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return app.Run(ctx, app.Config{
		Node:           *node,
		Labels:         lbls,
		NATSURLs:       strings.Split(*natsURL, ","),
		Seed:           seed,
		RequestTimeout: *timeout,
		Backend:        *backend,
		Libvirt: libvirt.Config{
			Socket:             *socket,
			URI:                *uri,
			Pool:               *pool,
			DomainType:         *domainType,
			Images:             images,
			ImagePruneInterval: *pruneEvery,
			ShutdownGrace:      *grace,
			TunnelAddress:      tunnel,
			Netns:              *netns,
			ConsoleDir:         *consoleDir,
			ConsoleLocalDir:    *consoleLocal,
		},
		Nova: nova.Config{
			CloudsFile:         *clouds,
			Cloud:              *cloud,
			Region:             *region,
			PollInterval:       *novaPoll,
			Images:             images,
			ImagePruneInterval: *pruneEvery,
		},
		KubeVirt: kubevirt.Config{
			Kubeconfig: *kvConfig,
			Namespace:  *kvNamespace,
			AccessMode: corev1.PersistentVolumeAccessMode(*kvAccessMode),
			Images:     images,
		},
		HeartbeatInterval:     *heartbeat,
		FenceAfter:            *fenceAfter,
		SharedPools:           app.ParseList(*sharedPools),
		ResyncInterval:        *resync,
		Workers:               *workers,
		CPUAllocationRatio:    *cpuRatio,
		MemoryAllocationRatio: *memoryRatio,
		MetricsAddress:        *metricsAddr,
		PprofAddress:          *pprofAddr,
		MigrationURI:          *migrationURI,
		ConsoleSessions:       *consoles,
		ConsoleBytesPerSecond: *consoleRate,
		Log:                   log,
	})
}
