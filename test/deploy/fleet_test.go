package deploy_test

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	computev1alpha1 "github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/harness/controlplane"
	"github.com/virtfleet/virtfleet/internal/harness/crossplanetest"
	"github.com/virtfleet/virtfleet/internal/harness/guesthost"
	"github.com/virtfleet/virtfleet/internal/harness/kubenode"
	"github.com/virtfleet/virtfleet/internal/harness/libvirttest"
	"github.com/virtfleet/virtfleet/internal/harness/manifests"
	"github.com/virtfleet/virtfleet/internal/harness/natstest"
	"github.com/virtfleet/virtfleet/internal/natswire"
)

// node is the kubelet node's name; its dots take the way a real host name
// does, through the DaemonSet's spec.nodeName to the agent's NATS identity.
const node = "hv-1.deploy.test"

// natsStore is where the node keeps the NATS server's store: the path of
// the PersistentVolume an administrator makes for the StatefulSet's claim
// on a cluster without a dynamic provisioner.
const natsStore = "/run/virtfleet-nats"

// skipWithoutKubelet skips t where a kubelet node cannot run.
func skipWithoutKubelet(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the agent and NATS images and runs a kubelet; skipped with -short")
	}
	if m := kubenode.Missing(); len(m) > 0 {
		t.Skipf("needs %v (make deps, as root)", m)
	}
	if _, err := exec.LookPath("kubectl"); err != nil {
		t.Skip("needs kubectl, which renders the kustomization as a user's `kubectl apply -k` does")
	}
}

// fleet is what every way of running the hub needs first, as the README's
// install section brings it up: a kubelet node labelled as a hypervisor,
// NATS's StatefulSet and the agent DaemonSet from cluster/deploy on it,
// the agent's heartbeat in NATS.
type fleet struct {
	cp   *controlplane.ControlPlane
	node *kubenode.Node
	// libvirt is the node's libvirtd, outside the agent's pod, as a
	// hypervisor's is: its guests are the node's, not the pod's.
	libvirt interface {
		Dial() (*golibvirt.Libvirt, error)
	}
	// real is the node's hypervisor where it runs real guests, else nil.
	real *realHost
	// images are the references cluster/deploy's image names are replaced
	// by (deployObjects).
	images map[string]string
	// hubID is the hub's NATS identity, whose users entry is in nats-auth.
	hubID natswire.Identity
	// natsAddr is the NATS pod's address, which the node routes to.
	natsAddr string
	// hub is the test's connection to NATS as the hub.
	hub jetstream.JetStream
	// agentPatch gives the agents NATS and the node's libvirtd; an overlay
	// rendered again keeps it.
	agentPatch map[string]any
	// agent is the agent's pod, heartbeat its first heartbeat's revision.
	agent     *corev1.Pod
	heartbeat uint64
	// created is what is applied of cluster/deploy so far, by kind/name.
	created map[string]bool
}

// clusterControllers are the controllers of kube-controller-manager the
// deploy tests run, as a cluster does: those the workloads of
// cluster/deploy and Crossplane's chart need (Crossplane's ClusterRole is
// an aggregate; its package revisions' objects go by their owners).
var clusterControllers = []string{
	"daemonset", "nodelifecycle", "statefulset", "persistentvolume-binder", "serviceaccount", "deployment", "replicaset",
	"root-ca-cert-publisher", "endpointslice", "garbagecollector", "clusterrole-aggregation",
}

// startFleet starts a kubelet node for t against cp, pulling from reg,
// with kube-scheduler and kube-controller-manager (the controllers
// workloads need), kube-proxy and the cluster's DNS, and runs NATS's
// StatefulSet and then the agent DaemonSet on it from cluster/deploy with
// images.
//
// NATS comes up first: its store on a PersistentVolume made for its claim,
// its users from the nats-auth Secret (README, step 4), and it answers the
// test, which stands in for the hub until one runs, only with credentials.
// The test makes the buckets, as the hub does; then the agent, on the
// node's own network, connects to that NATS, by its Service's name and
// the DaemonSet's own URL, with the node's own
// credentials (the file the DaemonSet mounts from the host) and to the
// node's libvirtd (its socket, mounted from the host), and its heartbeat,
// which is what makes a node eligible to a hub, appears.
//
// The node's libvirtd is real's, where it is given: the node joins its
// network namespace and the agent runs its guests in QEMU. Else it is
// libvirt's test driver.
//
// If t fails, the logs of NATS's, the agent's and the hub's pods (hubPods,
// a namespace_name glob) are logged.
func startFleet(t *testing.T, cp *controlplane.ControlPlane, reg *crossplanetest.Registry, images map[string]string, hubPods string, real *realHost) *fleet {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	hubID, agents, users := natstest.Identities(t, node)
	// What `go run ./hack/mint-agent-credentials NODE` writes and the
	// node's provisioning puts at /etc/virtfleet/agent.nk.
	seed := filepath.Join(t.TempDir(), "agent.nk")
	require.NoError(t, os.WriteFile(seed, agents[node].Seed, 0o600))
	store := filepath.Join(t.TempDir(), "nats")
	require.NoError(t, os.Mkdir(store, 0o755)) //nolint:gosec // the node's disk, as a local volume's
	f := &fleet{cp: cp, images: images, hubID: hubID, created: map[string]bool{}, real: real}
	socket, libvirtEnv := f.startLibvirt(t)

	kubenode.StartSchedulingForTest(t, cp, clusterControllers...)
	n, _ := kubenode.StartForTest(t, cp, reg, node, func(o *kubenode.Options) {
		o.HostPaths = map[string]string{
			"/run/libvirt/libvirt-sock": socket,
			"/etc/virtfleet/agent.nk":   seed,
			natsStore:                   store,
		}
		if real != nil {
			o.Netns = real.Netns
			o.Forward = append(o.Forward, real.imagePort)
			// Where the node's libvirtd has its guests' consoles, which
			// the DaemonSet mounts for the agent.
			o.HostPaths["/var/lib/libvirt/qemu"] = real.LibDir("qemu")
		}
	})
	f.node = n
	labelHypervisor(ctx, t, cp, n, false)
	start := time.Now()
	kubenode.StartClusterDNS(t, cp, reg)
	t.Logf("cluster DNS Ready %s after it was applied", time.Since(start).Round(100*time.Millisecond))
	t.Cleanup(func() {
		if t.Failed() {
			logPods(t, n, "virtfleet-system_nats-0", "virtfleet-system_virtfleet-agent-*", hubPods)
		}
	})

	start = time.Now()
	objs := deployObjects(t, images)
	f.apply(ctx, t, objs, "Namespace/virtfleet-system")
	require.NoError(t, cp.Client.Create(ctx, natsAuth(users)))
	natsStorage(ctx, t, cp, node)
	f.apply(ctx, t, objs, "ConfigMap/nats-config", "Service/nats", "Service/nats-headless", "StatefulSet/nats")
	nats := readyPod(ctx, t, cp, "nats-0")
	t.Logf("NATS pod %s (%s) Ready %s after its StatefulSet was applied", nats.Name, nats.Status.PodIP, time.Since(start).Round(100*time.Millisecond))
	f.natsAddr = net.JoinHostPort(nats.Status.PodIP, "4222")
	exposed, err := n.Expose(f.natsAddr)
	require.NoError(t, err)

	_, err = natsgo.Connect("nats://" + exposed)
	require.Error(t, err, "NATS lets in a client without credentials: the nats-auth Secret's users are not in force")
	f.hub = hubJetStream(ctx, t, "nats://"+exposed, hubID)
	assert.DirExists(t, filepath.Join(store, "jetstream"), "NATS keeps its streams on its claim's volume")

	start = time.Now()
	f.agentPatch = podPatch(t, "DaemonSet", "virtfleet-agent", "agent", libvirtEnv, nil)
	f.apply(ctx, t, deployObjects(t, images, f.agentPatch), "ServiceAccount/virtfleet-agent", "DaemonSet/virtfleet-agent")
	f.agent = runningPod(ctx, t, cp, "", "")
	running := time.Now()
	t.Logf("agent pod %s Running %s after the DaemonSet was applied", f.agent.Name, running.Sub(start).Round(100*time.Millisecond))
	f.heartbeat = awaitHeartbeat(ctx, t, f.hub, 0)
	t.Logf("node %s Ready (heartbeat) %s after its agent pod ran, %s after the DaemonSet was applied",
		node, time.Since(running).Round(100*time.Millisecond), time.Since(start).Round(100*time.Millisecond))
	assert.Equal(t, node, f.agent.Spec.NodeName)
	assertAgentProcess(t, n, f.agent)
	return f
}

// startLibvirt starts the node's libvirtd, unless it is real's, and returns
// its socket and the agent's environment that reaches it.
func (f *fleet) startLibvirt(t *testing.T) (socket string, env map[string]string) {
	t.Helper()
	if f.real == nil {
		lv := libvirttest.Start(t, node)
		f.libvirt = lv
		return lv.Socket, map[string]string{"VIRTFLEET_LIBVIRT_URI": lv.URI, "VIRTFLEET_LIBVIRT_POOL": libvirttest.Pool}
	}
	f.libvirt = f.real.Host
	return f.real.Socket, map[string]string{
		"VIRTFLEET_LIBVIRT_URI":         f.real.URI,
		"VIRTFLEET_LIBVIRT_POOL":        guesthost.Pool,
		"VIRTFLEET_LIBVIRT_DOMAIN_TYPE": guesthost.DomainType,
		// The guests without an operating system ignore ACPI: a stop
		// forces them off after this.
		"VIRTFLEET_SHUTDOWN_GRACE": "10s",
	}
}

// apply creates the objects of objs named by keys (kind/name).
func (f *fleet) apply(ctx context.Context, t *testing.T, objs map[string]client.Object, keys ...string) {
	t.Helper()
	for _, key := range keys {
		require.NoError(t, f.cp.Client.Create(ctx, objs[key]), key)
		f.created[key] = true
	}
}

// hubCredentials stores the hub's NATS seed where the README's step 4 puts
// it and the ClusterProviderConfig names it.
func (f *fleet) hubCredentials(ctx context.Context, t *testing.T) {
	t.Helper()
	require.NoError(t, f.cp.Client.Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: "virtfleet-system", Name: "hub-nats-credentials"},
		StringData: map[string]string{"hub.nk": string(f.hubID.Seed)},
	}))
}

// natsURL is where the README's step 6 tells the hub NATS is, and the
// agent DaemonSet's default: the NATS Service's name, which the cluster's
// DNS resolves and kube-proxy reaches.
const natsURL = "nats://nats.virtfleet-system.svc:4222"

// applyProviderConfig applies the README's ClusterProviderConfig (step 6)
// with the natsURL it says.
func (f *fleet) applyProviderConfig(ctx context.Context, t *testing.T) {
	t.Helper()
	cpc, err := manifests.Load(filepath.Join(controlplane.RepoRoot(), "examples", "providerconfig", "clusterproviderconfig.yaml"))
	require.NoError(t, err)
	require.Len(t, cpc, 1)
	require.NoError(t, unstructured.SetNestedField(cpc[0].Object, natsURL, "spec", "natsURL"))
	require.NoError(t, f.cp.Client.Create(ctx, cpc[0]))
}

// stopThroughAPI waits until the API server reaches the hub's aggregated
// API, then stops vm with `kubectl virtfleet stop` through it, and waits
// until the VM is Stopped.
func (f *fleet) stopThroughAPI(ctx context.Context, t *testing.T, kubectl func(args ...string) string, vm *computev1alpha1.VirtualMachine) {
	t.Helper()
	awaitAPIService(ctx, t, f.cp)
	out := kubectl("virtfleet", "-n", vm.Namespace, "stop", vm.Name)
	assert.Contains(t, out, "stop requested by virtfleet-admin")
	f.awaitPhase(ctx, t, vm, computev1alpha1.PhaseStopped)
}

// runVM applies a VirtualMachine name with a boot Volume of its own and
// waits until the hub has placed it on the node and the agent reports it
// Running, and returns it.
func (f *fleet) runVM(ctx context.Context, t *testing.T, name string) *computev1alpha1.VirtualMachine {
	t.Helper()
	vm := f.createVM(ctx, t, name)
	f.awaitPhase(ctx, t, vm, computev1alpha1.PhaseRunning)
	assert.Equal(t, node, vm.Status.AtProvider.Node)
	return vm
}

// createVM applies a VirtualMachine name with a boot Volume of its own,
// name-root, and returns it.
func (f *fleet) createVM(ctx context.Context, t *testing.T, name string) *computev1alpha1.VirtualMachine {
	t.Helper()
	require.NoError(t, f.cp.Client.Create(ctx, &computev1alpha1.Volume{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name + "-root"},
		Spec:       computev1alpha1.VolumeSpec{ForProvider: computev1alpha1.VolumeParameters{Size: resource.MustParse("1Gi")}},
	}))
	vm := &computev1alpha1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: computev1alpha1.VirtualMachineSpec{ForProvider: computev1alpha1.VirtualMachineParameters{
			Vcpu:            1,
			Memory:          resource.MustParse("128Mi"),
			DiskAttachments: []computev1alpha1.DiskAttachment{{Name: computev1alpha1.LocalName(name + "-root")}},
		}},
	}
	require.NoError(t, f.cp.Client.Create(ctx, vm))
	return vm
}

// awaitPhase waits until vm's status says phase, and leaves vm as read.
func (f *fleet) awaitPhase(ctx context.Context, t *testing.T, vm *computev1alpha1.VirtualMachine, phase computev1alpha1.Phase) {
	t.Helper()
	err := wait.PollUntilContextCancel(ctx, time.Second, true, func(ctx context.Context) (bool, error) {
		if err := f.cp.Client.Get(ctx, client.ObjectKeyFromObject(vm), vm); err != nil {
			return false, err
		}
		return vm.Status.AtProvider.Phase == phase, nil
	})
	require.NoError(t, err, "VM %s is not %s: %+v", vm.Name, phase, vm.Status)
}
