package deploy_test

import (
	"context"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"
	"github.com/go-logr/logr/testr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"libvirt.org/go/libvirtxml"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	computev1alpha1 "github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/harness/controlplane"
	"github.com/virtfleet/virtfleet/internal/harness/crossplanetest"
	"github.com/virtfleet/virtfleet/internal/harness/guesthost"
	"github.com/virtfleet/virtfleet/internal/harness/kubenode"
	"github.com/virtfleet/virtfleet/internal/harness/natstest"
)

// The lifecycle test's nodes and what the hub and agents are told for HA:
// a short lease and margin, so that a lost node's guests move soon, and
// the pool both hypervisors reach.
const (
	infraNode   = "infra"
	hvA, hvB    = "hv-a", "hv-b"
	sharedPool  = "shared"
	fenceAfter  = "10s"
	fenceMargin = "3s"
)

// A small cluster as users run one: an infrastructure node running NATS,
// the hub and the cluster's DNS, and two hypervisor nodes, tainted so that
// only the agent DaemonSet runs there, each sharing the network namespace
// of one host of a guesthost.Pair (its libvirtd, its QEMUs), with a pool on
// storage both reach. The nodes' pods reach each other over links
// (kubenode.Link) from the infrastructure node to each hypervisor, so the
// agents reach NATS and the DNS by their Services.
//
// A VM with availability Restart runs on hv-a from a disk in the shared
// pool. hv-a is then lost whole, as a machine that loses power is: its
// kubelet, containerd and the agent's pod stop, and its libvirtd and QEMU
// are killed. Its HypervisorNode turns Ready False, NodeLost, and the VM
// runs again on hv-b, from the same disk, saying where it came from. Last
// the agent's pod on hv-b is deleted: the DaemonSet's new pod adopts the
// guest, whose domain keeps its id and whose VM its restart count.
func TestALostKubeletNodesGuestRunsOnAnother(t *testing.T) {
	skipWithoutKubelet(t)
	if m := guesthost.Missing(); len(m) > 0 {
		t.Skipf("a real hypervisor needs %v: run make deps as root", m)
	}
	log.SetLogger(testr.New(t))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	cp := controlplane.StartForTestWith(t, controlplane.Options{InClusterAddress: kubenode.NodeIP, Aggregation: true, ClusterEgress: true})
	reg, err := crossplanetest.StartRegistry()
	require.NoError(t, err)
	t.Cleanup(reg.Stop)
	images := pushFleetImages(t, reg)

	pair, err := guesthost.StartPair(ctx, "vfdepha", testWriter{t})
	require.NoError(t, err)
	t.Cleanup(pair.Close)
	shared, err := pair.SharedPool(sharedPool)
	require.NoError(t, err)
	hosts := map[string]*guesthost.Host{hvA: pair.A, hvB: pair.B}

	hubID, agents, users := natstest.Identities(t, hvA, hvB)
	store := filepath.Join(t.TempDir(), "nats")
	require.NoError(t, os.Mkdir(store, 0o755)) //nolint:gosec // the node's disk, as a local volume's
	kubenode.StartSchedulingForTest(t, cp, clusterControllers...)
	infra, _ := kubenode.StartForTest(t, cp, reg, infraNode, func(o *kubenode.Options) {
		o.PodSubnet = kubenode.PodSubnet(1)
		o.HostPaths = map[string]string{natsStore: store}
	})
	nodes := map[string]*kubenode.Node{}
	for i, name := range []string{hvA, hvB} {
		seed := filepath.Join(t.TempDir(), "agent.nk")
		require.NoError(t, os.WriteFile(seed, agents[name].Seed, 0o600))
		h := hosts[name]
		nodes[name], _ = kubenode.StartForTest(t, cp, reg, name, func(o *kubenode.Options) {
			o.PodSubnet = kubenode.PodSubnet(2 + i)
			o.Netns = h.Netns
			o.HostPaths = map[string]string{
				"/run/libvirt/libvirt-sock": h.Socket,
				"/etc/virtfleet/agent.nk":   seed,
				"/var/lib/libvirt/qemu":     h.LibDir("qemu"),
			}
		})
		require.NoError(t, kubenode.Link(ctx, infra, nodes[name]))
		labelHypervisor(ctx, t, cp, nodes[name], true)
	}
	t.Cleanup(func() {
		if t.Failed() {
			logPods(t, infra, "virtfleet-system_nats-0", "virtfleet-system_virtfleet-hub-*")
			for _, n := range nodes {
				logPods(t, n, "virtfleet-system_virtfleet-agent-*")
			}
		}
	})
	kubenode.StartClusterDNS(t, cp, reg)

	start := time.Now()
	f := &fleet{cp: cp, images: images, hubID: hubID, created: map[string]bool{}}
	f.agentPatch = podPatch(t, "DaemonSet", "virtfleet-agent", "agent", map[string]string{
		"VIRTFLEET_LIBVIRT_POOL":        guesthost.Pool,
		"VIRTFLEET_LIBVIRT_DOMAIN_TYPE": guesthost.DomainType,
		"VIRTFLEET_SHUTDOWN_GRACE":      "10s",
		"VIRTFLEET_FENCE_AFTER":         fenceAfter,
		"VIRTFLEET_SHARED_POOLS":        sharedPool,
	}, nil)
	hubPatch := podPatch(t, "Deployment", "virtfleet-hub", "hub", map[string]string{"VIRTFLEET_FENCING_MARGIN": fenceMargin}, nil)
	objs := deployObjects(t, images, f.agentPatch, hubPatch)
	f.apply(ctx, t, objs, "Namespace/virtfleet-system")
	require.NoError(t, cp.Client.Create(ctx, natsAuth(users)))
	natsStorage(ctx, t, cp, infraNode)
	f.hubCredentials(ctx, t)
	for key := range objs {
		if !f.created[key] {
			f.apply(ctx, t, objs, key)
		}
	}
	f.applyProviderConfig(ctx, t)
	for _, name := range []string{hvA, hvB} {
		awaitNodeReady(ctx, t, cp, name, metav1.ConditionTrue)
	}
	t.Logf("cluster DNS, NATS, hub and agents applied; both HypervisorNodes Ready %s later", time.Since(start).Round(100*time.Millisecond))

	// The VM's disk, in the shared pool, imported by name.
	const disk = "ha-root.qcow2"
	out, err := exec.CommandContext(ctx, "qemu-img", "create", "-q", "-f", "qcow2", filepath.Join(shared, disk), "64M").CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.NoError(t, os.Chmod(filepath.Join(shared, disk), 0o666)) //nolint:gosec // as the shared pool's other files
	vol := &computev1alpha1.Volume{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "ha-root"},
		Spec: computev1alpha1.VolumeSpec{ForProvider: computev1alpha1.VolumeParameters{
			Size: resource.MustParse("64Mi"), StoragePool: sharedPool,
		}},
	}
	meta.SetExternalName(vol, disk)
	meta.AddAnnotations(vol, map[string]string{computev1alpha1.AnnotationNode: hvA})
	require.NoError(t, cp.Client.Create(ctx, vol))
	vm := &computev1alpha1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "ha",
			Annotations: map[string]string{computev1alpha1.AnnotationNode: hvA}},
		Spec: computev1alpha1.VirtualMachineSpec{ForProvider: computev1alpha1.VirtualMachineParameters{
			Vcpu:            1,
			Memory:          resource.MustParse("128Mi"),
			DiskAttachments: []computev1alpha1.DiskAttachment{{Name: "ha-root"}},
			Availability:    ptr.To(computev1alpha1.AvailabilityRestart),
		}},
	}
	require.NoError(t, cp.Client.Create(ctx, vm))
	f.awaitPhase(ctx, t, vm, computev1alpha1.PhaseRunning)
	require.Equal(t, hvA, vm.Status.AtProvider.Node)

	// hv-a lost whole.
	lost := time.Now()
	nodes[hvA].Stop()
	pair.A.Crash()
	awaitNodeReady(ctx, t, cp, hvA, metav1.ConditionFalse)
	t.Logf("HypervisorNode %s NodeLost %s after its kubelet node and host died", hvA, time.Since(lost).Round(100*time.Millisecond))
	err = wait.PollUntilContextTimeout(ctx, time.Second, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
		if err := cp.Client.Get(ctx, client.ObjectKeyFromObject(vm), vm); err != nil {
			return false, err
		}
		return vm.Status.AtProvider.Phase == computev1alpha1.PhaseRunning && vm.Status.AtProvider.Node == hvB, nil
	})
	require.NoError(t, err, "the VM does not run on %s: %+v", hvB, vm.Status)
	t.Logf("VM Running on %s %s after %s died (lease %s, margin %s)", hvB, time.Since(lost).Round(100*time.Millisecond), hvA, fenceAfter, fenceMargin)
	assert.Contains(t, vm.GetAnnotations()[computev1alpha1.AnnotationRestartedFrom], hvA+"@")
	before, definition := domainOn(t, pair.B, vm)
	var volumes []libvirtxml.DomainDiskSourceVolume
	for _, d := range definition.Devices.Disks {
		if d.Source != nil && d.Source.Volume != nil {
			volumes = append(volumes, *d.Source.Volume)
		}
	}
	assert.Contains(t, volumes, libvirtxml.DomainDiskSourceVolume{Pool: sharedPool, Volume: disk}, "the guest on %s runs from the disk on shared storage", hvB)
	restarts := vm.Status.AtProvider.RestartCount

	// The agent's pod on hv-b replaced: the new one adopts the guest.
	var pods corev1.PodList
	require.NoError(t, cp.Client.List(ctx, &pods, client.InNamespace("virtfleet-system"), client.MatchingFields{"spec.nodeName": hvB},
		client.MatchingLabels{"app.kubernetes.io/name": "virtfleet-agent"}))
	require.Len(t, pods.Items, 1, "the agent pods on %s", hvB)
	old := pods.Items[0]
	replaced := time.Now()
	require.NoError(t, cp.Client.Delete(ctx, &old))
	again := runningPod(ctx, t, cp, old.UID, hvB)
	// The new agent has adopted what runs once it has resynced: read its
	// own word for it, its metrics, on the node's network.
	metrics := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		DialContext: func(_ context.Context, _, addr string) (net.Conn, error) { return nodes[hvB].Dial(addr) },
	}}
	require.NoError(t, wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		families, err := scrape(ctx, metrics, "127.0.0.1:8090")
		if err != nil {
			return false, nil //nolint:nilerr // not serving yet
		}
		for _, m := range families["virtfleet_agent_resync_duration_seconds"].GetMetric() {
			if m.GetHistogram().GetSampleCount() > 0 {
				return true, nil
			}
		}
		return false, nil
	}), "the new agent on %s never resynced", hvB)
	t.Logf("agent pod on %s replaced by %s, resynced %s after the old one was deleted", hvB, again.Name, time.Since(replaced).Round(100*time.Millisecond))
	f.awaitPhase(ctx, t, vm, computev1alpha1.PhaseRunning)
	assert.Equal(t, hvB, vm.Status.AtProvider.Node)
	assert.Equal(t, restarts, vm.Status.AtProvider.RestartCount, "the guest restarted")
	after, _ := domainOn(t, pair.B, vm)
	assert.Equal(t, before, after, "the guest's domain was started again")
}

// domainOn is the id h's libvirtd gave vm's domain when it last started,
// and the domain's definition.
func domainOn(t *testing.T, h *guesthost.Host, vm *computev1alpha1.VirtualMachine) (int32, *libvirtxml.Domain) {
	t.Helper()
	l, dom := lookupDomain(t, h, vm)
	defer l.Disconnect() //nolint:errcheck // read-only
	x, err := l.DomainGetXMLDesc(dom, 0)
	require.NoError(t, err)
	var def libvirtxml.Domain
	require.NoError(t, def.Unmarshal(x))
	return dom.ID, &def
}

// awaitNodeReady waits until HypervisorNode name's Ready condition is
// status.
func awaitNodeReady(ctx context.Context, t *testing.T, cp *controlplane.ControlPlane, name string, status metav1.ConditionStatus) {
	t.Helper()
	var hn computev1alpha1.HypervisorNode
	err := wait.PollUntilContextTimeout(ctx, time.Second, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
		if err := cp.Client.Get(ctx, client.ObjectKey{Name: name}, &hn); err != nil {
			return false, client.IgnoreNotFound(err)
		}
		for _, c := range hn.Status.Conditions {
			if c.Type == computev1alpha1.NodeConditionReady {
				return c.Status == status && (status == metav1.ConditionTrue || c.Reason == computev1alpha1.NodeReasonLost), nil
			}
		}
		return false, nil
	})
	require.NoError(t, err, "HypervisorNode %s is not Ready %s: %+v", name, status, hn.Status.Conditions)
}
