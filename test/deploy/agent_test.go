// Package deploy_test installs virtfleet as its users do, from
// cluster/deploy's manifests with images built by cluster/images, on real
// kubelets (internal/harness/kubenode), and checks what comes up.
package deploy_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	reference "github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/yaml"

	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/build/ociimage"
	"github.com/virtfleet/virtfleet/internal/harness/controlplane"
	"github.com/virtfleet/virtfleet/internal/harness/crossplanetest"
	"github.com/virtfleet/virtfleet/internal/harness/kubenode"
	"github.com/virtfleet/virtfleet/internal/natswire"
)

// cluster/deploy as `kubectl apply -k` of an overlay a user would write
// applies it (the images from the user's registry, the agents' NATS URL
// and libvirt URI through the documented environment) runs on a kubelet
// node labelled as a hypervisor, with images built here as cluster/images
// builds them.
//
// NATS's StatefulSet comes up first: its store on a PersistentVolume made
// for its claim, its users from the nats-auth Secret (README, step 4), and
// it answers the test, which stands in for the hub, only with credentials.
// The hub makes the buckets; then the agent's DaemonSet runs: the agent,
// on the node's own network, connects to that NATS with the node's own
// credentials (the file the DaemonSet mounts from the host) and to the
// node's libvirtd (its socket, mounted from the host), and its heartbeat,
// which is what makes a node eligible to a hub, appears. Killed, its pod
// comes back through the DaemonSet controller and so does the heartbeat.
//
// Last the hub's Deployment (two replicas, leader election, its RBAC)
// runs on the node against the test's API server, with its
// ServiceAccount's token, and a VirtualMachine the test applies is
// placed on the node, its intent applied by the agent pod (libvirt's test
// driver) and reported Running; `kubectl virtfleet stop` then stops it
// through the API server and the aggregated API cluster/deploy/api routes
// to the hub's pods.
//
// The node runs kube-proxy and the cluster runs CoreDNS, so the agent and
// the hub reach NATS by its Service's name, as cluster/deploy and the
// README say; the test reaches the NATS pod's IP through the node's
// namespace (kubenode.Node.Expose). The hub's pods reach the API server
// as any in-cluster client does, by the kubernetes Service, whose endpoint
// the API server advertises at the node's address, where the node forwards
// its port (controlplane.Options.InClusterAddress); and the API server
// reaches the aggregated API's endpoints through the node
// (controlplane.Options.ClusterEgress).
func TestAgentDaemonSetOnKubelet(t *testing.T) {
	skipWithoutKubelet(t)
	// The API server's warnings about what is applied, in the test's log.
	log.SetLogger(testr.New(t))
	cp := controlplane.StartForTestWith(t, controlplane.Options{InClusterAddress: kubenode.NodeIP, Aggregation: true, ClusterEgress: true})
	reg, err := crossplanetest.StartRegistry()
	require.NoError(t, err)
	t.Cleanup(reg.Stop)

	images := pushFleetImages(t, reg)
	f := startFleet(t, cp, reg, images, "virtfleet-system_virtfleet-hub-*", nil)

	// Killed, the agent's pod comes back through the DaemonSet controller,
	// and so does the heartbeat.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	start := time.Now()
	require.NoError(t, cp.Client.Delete(ctx, f.agent))
	again := runningPod(ctx, t, cp, f.agent.UID, "")
	running := time.Now()
	awaitHeartbeat(ctx, t, f.hub, f.heartbeat)
	t.Logf("killed agent pod replaced by %s, Running after %s, heartbeat %s later",
		again.Name, running.Sub(start).Round(100*time.Millisecond), time.Since(running).Round(100*time.Millisecond))

	// The hub's Deployment, against the test's API server, with its
	// ServiceAccount's token, and NATS with the hub's seed from its Secret.
	ctx, cancel = context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	start = time.Now()
	f.hubCredentials(ctx, t)
	objs := deployObjects(t, images, f.agentPatch)
	for key := range objs {
		if !f.created[key] {
			f.apply(ctx, t, objs, key)
		}
	}
	f.applyProviderConfig(ctx, t)
	vm := f.runVM(ctx, t, "vm")
	t.Logf("VM Running on %s %s after the hub's Deployment was applied", vm.Status.AtProvider.Node, time.Since(start).Round(100*time.Millisecond))
	f.stopThroughAPI(ctx, t, userKubectl(ctx, t, cp), vm)
	t.Logf("VM stopped through the aggregated API %s after the hub's Deployment was applied", time.Since(start).Round(100*time.Millisecond))
}

// pushFleetImages builds the agent's, the hub's and NATS's images as
// cluster/images does and pushes them to reg, returning the references
// cluster/deploy's image names are to be replaced by.
func pushFleetImages(t *testing.T, reg *crossplanetest.Registry) map[string]string {
	t.Helper()
	// A cold build of the agent or nats-server is minutes on a loaded
	// small machine; the go build cache makes the next one seconds.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	start := time.Now()
	images := map[string]string{
		"ghcr.io/virtfleet/virtfleet-agent": pushImage(ctx, t, reg, virtfleetSpec(t, ociimage.Agent.Name, imageVersion), "virtfleet/virtfleet-agent", "test"),
		"ghcr.io/virtfleet/virtfleet-hub":   pushImage(ctx, t, reg, virtfleetSpec(t, ociimage.Hub.Name, imageVersion), "virtfleet/virtfleet-hub", "test"),
		"docker.io/library/nats":            pushImage(ctx, t, reg, ociimage.NATS, "virtfleet/nats", "test"),
	}
	t.Logf("agent, hub and NATS images %v built and pushed in %s", images, time.Since(start).Round(100*time.Millisecond))
	return images
}

// natsAuth is the nats-auth Secret of the README's step 4: the users
// entries `go run ./hack/mint-agent-credentials` prints, in auth.conf.
func natsAuth(users []natswire.User) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: "virtfleet-system", Name: "nats-auth"},
		StringData: map[string]string{"auth.conf": natswire.ServerConfig(users...)},
	}
}

// natsStorage makes what an administrator makes for NATS's store where no
// provisioner serves claims (README, step 3): a local PersistentVolume of
// node, and the claim the StatefulSet's pod names (its template data, pod
// nats-0) bound to it, waiting until it is Bound. The StatefulSet takes an
// existing claim of that name as its own. Made with the pod, the claim can
// be missing from the scheduler's view when the pod is first scheduled,
// and the pod then waits for the scheduler's periodic retry of
// unschedulable pods (five minutes).
func natsStorage(ctx context.Context, t *testing.T, cp *controlplane.ControlPlane, node string) {
	t.Helper()
	size := corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("2Gi")}
	rwo := []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}
	require.NoError(t, cp.Client.Create(ctx, &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "nats-store"},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      size,
			AccessModes:                   rwo,
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			PersistentVolumeSource:        corev1.PersistentVolumeSource{Local: &corev1.LocalVolumeSource{Path: natsStore}},
			// Bound both ways, whichever of the two the volume controller
			// sees first waits for the other, not for its resync.
			ClaimRef: &corev1.ObjectReference{Namespace: "virtfleet-system", Name: "data-nats-0"},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{node}}},
			}}}},
		},
	}))
	claim := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "virtfleet-system", Name: "data-nats-0"},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: rwo,
			Resources:   corev1.VolumeResourceRequirements{Requests: size},
			VolumeName:  "nats-store",
		},
	}
	require.NoError(t, cp.Client.Create(ctx, claim))
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		err := cp.Client.Get(ctx, client.ObjectKeyFromObject(claim), claim)
		return err == nil && claim.Status.Phase == corev1.ClaimBound, client.IgnoreNotFound(err)
	})
	require.NoError(t, err, "NATS's claim is not Bound: %+v", claim.Status)
}

// hubJetStream connects to NATS at url as the hub and makes the wire's
// buckets, as the hub does once it has a ProviderConfig.
func hubJetStream(ctx context.Context, t *testing.T, url string, id natswire.Identity) jetstream.JetStream {
	t.Helper()
	opts, err := id.ConnectOptions()
	require.NoError(t, err)
	nc, err := natsgo.Connect(url, opts...)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	require.NoError(t, natswire.EnsureBuckets(ctx, js, natswire.BucketConfig{}))
	return js
}

// readyPod waits until pod name of virtfleet-system is Ready, and returns it.
func readyPod(ctx context.Context, t *testing.T, cp *controlplane.ControlPlane, name string) *corev1.Pod {
	t.Helper()
	var pod corev1.Pod
	err := wait.PollUntilContextCancel(ctx, 500*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		if err := cp.Client.Get(ctx, client.ObjectKey{Namespace: "virtfleet-system", Name: name}, &pod); err != nil {
			return false, client.IgnoreNotFound(err)
		}
		for _, c := range pod.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
				return true, nil
			}
		}
		return false, nil
	})
	require.NoError(t, err, "pod %s is not Ready: %+v", name, pod.Status)
	return &pod
}

// assertAgentProcess checks, with the kernel's word for it, what the
// DaemonSet gives pod's agent process (the one containerd says it runs):
// n's network namespace, where libvirtd's bridges and the node's
// addresses are, not one of the pod's own; and exactly the capabilities
// the manifest adds, NET_ADMIN for the overlays' devices among them.
func assertAgentProcess(t *testing.T, n *kubenode.Node, pod *corev1.Pod) {
	t.Helper()
	require.Len(t, pod.Status.ContainerStatuses, 1)
	id := strings.TrimPrefix(pod.Status.ContainerStatuses[0].ContainerID, "containerd://")
	out, err := exec.Command("ctr", "--address", n.ContainerdSocket, "--namespace", "k8s.io", "task", "ls").Output()
	require.NoError(t, err)
	pid := ""
	for line := range strings.Lines(string(out)) {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == id {
			pid = f[1]
		}
	}
	require.NotEmpty(t, pid, "containerd runs no task %s: %s", id, out)
	agent, err := os.Stat(filepath.Join("/proc", pid, "ns", "net"))
	require.NoError(t, err)
	nodeNs, err := os.Stat(n.NetnsPath)
	require.NoError(t, err)
	assert.True(t, os.SameFile(nodeNs, agent), "the agent (pid %s) runs in a network namespace other than its node's", pid)

	status, err := os.ReadFile(filepath.Join("/proc", pid, "status")) //nolint:gosec // the agent's
	require.NoError(t, err)
	var effective uint64
	for line := range strings.Lines(string(status)) {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			effective, err = strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			require.NoError(t, err)
		}
	}
	const dacOverride, netAdmin = 1, 12 // linux/capability.h
	assert.Equal(t, uint64(1)<<dacOverride|uint64(1)<<netAdmin, effective,
		"the agent's effective capabilities (%#x) are not exactly DAC_OVERRIDE and NET_ADMIN", effective)
}

// logPods logs the end of each container's log of the pods on n matching
// pods (namespace_name globs), which go with the node.
func logPods(t *testing.T, n *kubenode.Node, pods ...string) {
	for _, pod := range pods {
		logs, _ := filepath.Glob(filepath.Join(n.Dir, "log", "pods", pod+"_*", "*", "*.log"))
		for _, l := range logs {
			b, _ := os.ReadFile(l) //nolint:gosec // the node's own log
			if len(b) > 6000 {
				b = append(b[:3000:3000], append([]byte("\n...\n"), b[len(b)-3000:]...)...)
			}
			t.Logf("%s:\n%s", l, b)
		}
	}
}

// imageVersion is the version virtfleet's images are built as, which
// their binaries report.
const imageVersion = "v0.0.0-deploy-test"

// virtfleetSpec is virtfleet's image name as cluster/images builds it
// for version.
func virtfleetSpec(t *testing.T, name, version string) ociimage.Spec {
	t.Helper()
	for _, spec := range ociimage.Virtfleet(version) {
		if spec.Name == name {
			return spec
		}
	}
	require.FailNow(t, "cluster/images builds no such image", name)
	return ociimage.Spec{}
}

// pushImage builds spec's image as cluster/images does and pushes it to
// reg as repo:tag, returning its reference.
func pushImage(ctx context.Context, t *testing.T, reg *crossplanetest.Registry, spec ociimage.Spec, repo, tag string) string {
	t.Helper()
	ref, err := reg.Push(ctx, repo, tag, buildImage(ctx, t, spec))
	require.NoError(t, err)
	return ref
}

// buildImage builds spec's image as cluster/images does.
func buildImage(ctx context.Context, t *testing.T, spec ociimage.Spec) v1.Image {
	t.Helper()
	p := ociimage.Platform{OS: "linux", Arch: runtime.GOARCH}
	img, err := ociimage.BuildFromSource(ctx, controlplane.RepoRoot(), spec, filepath.Join(t.TempDir(), spec.Name), p, time.Unix(0, 0).UTC())
	require.NoError(t, err)
	return img
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}

// labelHypervisor labels n as a hypervisor once it has registered, as an
// administrator does (`kubectl label node`), which the DaemonSet selects,
// and, if taint, taints it so that nothing else runs there (`kubectl taint
// node`), which the DaemonSet tolerates.
func labelHypervisor(ctx context.Context, t *testing.T, cp *controlplane.ControlPlane, n *kubenode.Node, taint bool) {
	t.Helper()
	var obj corev1.Node
	err := wait.PollUntilContextCancel(ctx, time.Second, true, func(ctx context.Context) (bool, error) {
		if err := n.Exited(); err != nil {
			return false, err
		}
		return cp.Client.Get(ctx, client.ObjectKey{Name: n.Name}, &obj) == nil, nil
	})
	require.NoError(t, err, "node %s did not register", n.Name)
	patch := client.MergeFrom(obj.DeepCopy())
	obj.Labels["virtfleet.io/hypervisor"] = "true"
	if taint {
		obj.Spec.Taints = append(obj.Spec.Taints, corev1.Taint{Key: "virtfleet.io/hypervisor", Value: "true", Effect: corev1.TaintEffectNoSchedule})
	}
	require.NoError(t, cp.Client.Patch(ctx, &obj, patch))
}

// deployObjects renders an overlay of cluster/deploy with kubectl
// kustomize, the images replaced by images (name to reference) and
// patches applied; it returns the objects, by kind/name, decoded as
// client-go's and the aggregator's types.
func deployObjects(t *testing.T, images map[string]string, patches ...map[string]any) map[string]client.Object {
	t.Helper()
	dir := t.TempDir()
	base, err := filepath.Rel(dir, filepath.Join(controlplane.RepoRoot(), "cluster", "deploy"))
	require.NoError(t, err)
	overlay := map[string]any{
		"apiVersion": "kustomize.config.k8s.io/v1beta1",
		"kind":       "Kustomization",
		"resources":  []string{base},
	}
	var replace []map[string]any
	for name, image := range images {
		ref, err := reference.NewTag(image)
		require.NoError(t, err)
		replace = append(replace, map[string]any{"name": name, "newName": ref.Context().Name(), "newTag": ref.TagStr()})
	}
	overlay["images"] = replace
	if len(patches) > 0 {
		overlay["patches"] = patches
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(mustYAML(t, overlay)), 0o600))
	out, err := exec.Command("kubectl", "kustomize", dir).Output()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		t.Logf("kubectl kustomize: %s", exit.Stderr)
	}
	require.NoError(t, err)

	objs := map[string]client.Object{}
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(out)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		o, gvk, err := deployCodecs.UniversalDeserializer().Decode(doc, nil, nil)
		require.NoError(t, err)
		obj, ok := o.(client.Object)
		require.True(t, ok, "%s", gvk)
		objs[gvk.Kind+"/"+obj.GetName()] = obj
	}
	for _, want := range []string{"Namespace/virtfleet-system", "ServiceAccount/virtfleet-agent", "DaemonSet/virtfleet-agent",
		"ConfigMap/nats-config", "Service/nats", "Service/nats-headless", "StatefulSet/nats"} {
		require.Contains(t, objs, want, "the rendered manifests lack it")
	}
	return objs
}

// deployCodecs decode every kind cluster/deploy holds.
var deployCodecs = func() serializer.CodecFactory {
	s := k8sruntime.NewScheme()
	utilruntime.Must(scheme.AddToScheme(s))
	utilruntime.Must(apiregistrationv1.AddToScheme(s))
	return serializer.NewCodecFactory(s)
}()

// podPatch is a kustomize patch of the pod template of workload kind
// name: env set in its container, and pod merged into its pod spec.
func podPatch(t *testing.T, kind, name, container string, env map[string]string, pod map[string]any) map[string]any {
	t.Helper()
	vars := make([]map[string]any, 0, len(env))
	for k, v := range env {
		vars = append(vars, map[string]any{"name": k, "value": v})
	}
	spec := map[string]any{"containers": []map[string]any{{"name": container, "env": vars}}}
	maps.Copy(spec, pod)
	return map[string]any{
		"target": map[string]any{"kind": kind, "name": name},
		"patch": mustYAML(t, map[string]any{
			"apiVersion": "apps/v1",
			"kind":       kind,
			"metadata":   map[string]any{"name": name},
			"spec":       map[string]any{"template": map[string]any{"spec": spec}},
		}),
	}
}

// runningPod waits until the agent DaemonSet's pod on node node (any, if
// empty) other than the one with uid not runs, and returns it.
func runningPod(ctx context.Context, t *testing.T, cp *controlplane.ControlPlane, not types.UID, node string) *corev1.Pod {
	t.Helper()
	var (
		pods    corev1.PodList
		ds      appsv1.DaemonSet
		running *corev1.Pod
	)
	err := wait.PollUntilContextCancel(ctx, 500*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		if err := cp.Client.List(ctx, &pods, client.InNamespace("virtfleet-system"),
			client.MatchingLabels{"app.kubernetes.io/name": "virtfleet-agent"}); err != nil {
			return false, err
		}
		for i := range pods.Items {
			p := &pods.Items[i]
			if p.UID != not && (node == "" || p.Spec.NodeName == node) && p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning {
				running = p
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		_ = cp.Client.Get(ctx, client.ObjectKey{Namespace: "virtfleet-system", Name: "virtfleet-agent"}, &ds)
	}
	require.NoError(t, err, "no agent pod runs; the DaemonSet's status: %+v; pods: %+v", ds.Status, pods.Items)
	return running
}

// awaitHeartbeat waits for a heartbeat of node's agent stored after
// revision after, checks it, and returns its revision.
func awaitHeartbeat(ctx context.Context, t *testing.T, hub jetstream.JetStream, after uint64) uint64 {
	t.Helper()
	key, err := wire.NodeKey(node)
	require.NoError(t, err)
	kv, err := hub.KeyValue(ctx, wire.BucketNodes)
	require.NoError(t, err)
	var entry jetstream.KeyValueEntry
	err = wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		e, err := kv.Get(ctx, key)
		if err != nil {
			return false, nil //nolint:nilerr // no heartbeat yet
		}
		entry = e
		return e.Revision() > after, nil
	})
	require.NoError(t, err, "no heartbeat of %s after revision %d", node, after)
	hb, err := wire.DecodeNodeHeartbeat(entry.Value())
	require.NoError(t, err)
	assert.Equal(t, node, hb.Node)
	assert.Equal(t, "libvirt", hb.Backend)
	assert.Positive(t, hb.Capacity.VCPU, "the agent reads the node's libvirtd")
	assert.Equal(t, imageVersion, hb.AgentVersion, "the agent reports the version its image was built as")
	return entry.Revision()
}

func mustYAML(t *testing.T, v any) string {
	t.Helper()
	b, err := yaml.Marshal(v)
	require.NoError(t, err)
	return string(b)
}
