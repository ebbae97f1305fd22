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
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/build/ociimage"
	"github.com/virtfleet/virtfleet/internal/harness/controlplane"
	"github.com/virtfleet/virtfleet/internal/harness/crossplanetest"
	"github.com/virtfleet/virtfleet/internal/harness/kubenode"
	"github.com/virtfleet/virtfleet/internal/harness/libvirttest"
	"github.com/virtfleet/virtfleet/internal/harness/natstest"
	"github.com/virtfleet/virtfleet/internal/natswire"
)

// node is the kubelet node's name; its dots take the way a real host name
// does, through the DaemonSet's spec.nodeName to the agent's NATS identity.
const node = "hv-1.deploy.test"

// The agent DaemonSet of cluster/deploy, as `kubectl apply -k` of an
// overlay a user would write applies it (the image from the user's
// registry, the NATS URL and the libvirt URI through the documented
// environment), runs the agent image cluster/images builds on a kubelet
// node labelled as a hypervisor; the agent connects to NATS with the
// node's own credentials (the file the DaemonSet mounts from the host)
// and to the node's libvirtd (its socket, mounted from the host), and
// its heartbeat, which is what makes a node eligible to a hub, appears.
// Killed, its pod comes back through the DaemonSet controller and so does
// the heartbeat. NATS runs on the machine's loopback here (in-process, a
// real nats-server): cluster/deploy's NATS StatefulSet is not applied.
func TestAgentDaemonSetOnKubelet(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the agent image and runs a kubelet; skipped with -short")
	}
	if m := kubenode.Missing(); len(m) > 0 {
		t.Skipf("needs %v (make deps, as root)", m)
	}
	if _, err := exec.LookPath("kubectl"); err != nil {
		t.Skip("needs kubectl, which renders the kustomization as a user's `kubectl apply -k` does")
	}
	cp := controlplane.StartForTest(t)
	reg, err := crossplanetest.StartRegistry()
	require.NoError(t, err)
	t.Cleanup(reg.Stop)

	// A cold build of the agent is minutes on a loaded small machine; the
	// go build cache makes the next one seconds.
	buildCtx, cancelBuild := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancelBuild()
	start := time.Now()
	image := pushAgentImage(buildCtx, t, reg)
	t.Logf("agent image %s built and pushed in %s", image, time.Since(start).Round(100*time.Millisecond))

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	srv, hub, agents := natstest.NewFleet(t, natswire.BucketConfig{}, node)
	natsURL, err := url.Parse(srv.URL())
	require.NoError(t, err)
	natsPort, err := strconv.Atoi(natsURL.Port())
	require.NoError(t, err)
	// What `go run ./hack/mint-agent-credentials NODE` writes and the
	// node's provisioning puts at /etc/virtfleet/agent.nk.
	seed := filepath.Join(t.TempDir(), "agent.nk")
	require.NoError(t, os.WriteFile(seed, agents[node].Seed, 0o600))
	lv := libvirttest.Start(t, node)

	kubenode.StartSchedulingForTest(t, cp, "daemonset", "nodelifecycle")
	n, _ := kubenode.StartForTest(t, cp, reg, node, func(o *kubenode.Options) {
		o.Forward = append(o.Forward, natsPort)
		o.HostPaths = map[string]string{
			"/run/libvirt/libvirt-sock": lv.Socket,
			"/etc/virtfleet/agent.nk":   seed,
		}
	})
	labelHypervisor(ctx, t, cp, n)
	t.Cleanup(func() {
		if t.Failed() {
			logAgents(t, n)
		}
	})

	start = time.Now()
	for _, obj := range agentObjects(t, image, "nats://"+kubenode.NodeIP+":"+natsURL.Port(), lv.URI) {
		require.NoError(t, cp.Client.Create(ctx, obj), "%T %s", obj, obj.GetName())
	}
	pod := runningPod(ctx, t, cp, "")
	running := time.Now()
	t.Logf("agent pod %s Running %s after the DaemonSet was applied", pod.Name, running.Sub(start).Round(100*time.Millisecond))
	rev := awaitHeartbeat(ctx, t, hub, 0)
	t.Logf("node %s Ready (heartbeat) %s after its agent pod ran, %s after the DaemonSet was applied",
		node, time.Since(running).Round(100*time.Millisecond), time.Since(start).Round(100*time.Millisecond))
	assert.Equal(t, node, pod.Spec.NodeName)
	assertInNodeNetns(t, n, pod)

	start = time.Now()
	require.NoError(t, cp.Client.Delete(ctx, pod))
	again := runningPod(ctx, t, cp, pod.UID)
	running = time.Now()
	awaitHeartbeat(ctx, t, hub, rev)
	t.Logf("killed agent pod replaced by %s, Running after %s, heartbeat %s later",
		again.Name, running.Sub(start).Round(100*time.Millisecond), time.Since(running).Round(100*time.Millisecond))
}

// assertInNodeNetns checks that pod's agent process is in n's network
// namespace, where libvirtd's bridges and the node's addresses are, and
// not in a namespace of the pod's own: the kernel's word for it, the
// namespace's inode, found through the process containerd says it runs.
func assertInNodeNetns(t *testing.T, n *kubenode.Node, pod *corev1.Pod) {
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
}

// logAgents logs the end of each agent container's log on n, which goes
// with the node.
func logAgents(t *testing.T, n *kubenode.Node) {
	logs, _ := filepath.Glob(filepath.Join(n.Dir, "log", "pods", "virtfleet-system_virtfleet-agent-*", "agent", "*.log"))
	for _, l := range logs {
		b, _ := os.ReadFile(l) //nolint:gosec // the node's own log
		if len(b) > 6000 {
			b = append(b[:3000:3000], append([]byte("\n...\n"), b[len(b)-3000:]...)...)
		}
		t.Logf("%s:\n%s", l, b)
	}
}

// pushAgentImage builds the agent's image as cluster/images does and pushes
// it to reg, returning its reference.
func pushAgentImage(ctx context.Context, t *testing.T, reg *crossplanetest.Registry) string {
	t.Helper()
	const version = "test"
	for _, spec := range ociimage.Virtfleet(version) {
		if spec.Name != ociimage.Agent.Name {
			continue
		}
		p := ociimage.Platform{OS: "linux", Arch: runtime.GOARCH}
		img, err := ociimage.BuildFromSource(ctx, controlplane.RepoRoot(), spec, filepath.Join(t.TempDir(), spec.Name), p, time.Unix(0, 0).UTC())
		require.NoError(t, err)
		ref, err := reg.Push(ctx, "virtfleet/virtfleet-"+spec.Name, version, img)
		require.NoError(t, err)
		return ref
	}
	require.FailNow(t, "cluster/images builds no agent image")
	return ""
}

// labelHypervisor labels n as a hypervisor once it has registered, as an
// administrator does (`kubectl label node`), which the DaemonSet selects.
func labelHypervisor(ctx context.Context, t *testing.T, cp *controlplane.ControlPlane, n *kubenode.Node) {
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
	require.NoError(t, cp.Client.Patch(ctx, &obj, patch))
}

// agentObjects renders an overlay of cluster/deploy with kubectl kustomize
// and returns the objects the agent needs: its namespace, ServiceAccount
// and DaemonSet, decoded by client-go's deserializer.
func agentObjects(t *testing.T, image, natsURL, libvirtURI string) []client.Object {
	t.Helper()
	ref, err := name.NewTag(image)
	require.NoError(t, err)
	dir := t.TempDir()
	base, err := filepath.Rel(dir, filepath.Join(controlplane.RepoRoot(), "cluster", "deploy"))
	require.NoError(t, err)
	env := func(key, value string) map[string]any { return map[string]any{"name": key, "value": value} }
	overlay := map[string]any{
		"apiVersion": "kustomize.config.k8s.io/v1beta1",
		"kind":       "Kustomization",
		"resources":  []string{base},
		"images": []map[string]any{{
			"name": "ghcr.io/virtfleet/virtfleet-agent", "newName": ref.Context().Name(), "newTag": ref.TagStr(),
		}},
		"patches": []map[string]any{{
			"target": map[string]any{"kind": "DaemonSet", "name": "virtfleet-agent"},
			"patch": mustYAML(t, map[string]any{
				"apiVersion": "apps/v1",
				"kind":       "DaemonSet",
				"metadata":   map[string]any{"name": "virtfleet-agent"},
				"spec": map[string]any{"template": map[string]any{"spec": map[string]any{
					"containers": []map[string]any{{
						"name": "agent",
						"env": []map[string]any{
							env("VIRTFLEET_NATS_URL", natsURL),
							env("VIRTFLEET_LIBVIRT_URI", libvirtURI),
							env("VIRTFLEET_LIBVIRT_POOL", libvirttest.Pool),
						},
					}},
				}}},
			}),
		}},
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(mustYAML(t, overlay)), 0o600))
	out, err := exec.Command("kubectl", "kustomize", dir).Output()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		t.Logf("kubectl kustomize: %s", exit.Stderr)
	}
	require.NoError(t, err)

	want := map[string]bool{"Namespace/virtfleet-system": true, "ServiceAccount/virtfleet-agent": true, "DaemonSet/virtfleet-agent": true}
	var objs []client.Object
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(out)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		o, gvk, err := scheme.Codecs.UniversalDeserializer().Decode(doc, nil, nil)
		if err != nil {
			continue // a kind client-go does not know: an APIService, say
		}
		obj, ok := o.(client.Object)
		require.True(t, ok, "%s", gvk)
		if want[gvk.Kind+"/"+obj.GetName()] {
			objs = append(objs, obj)
		}
	}
	require.Len(t, objs, len(want), "the rendered manifests lack some of %v", want)
	return objs
}

// runningPod waits until the agent DaemonSet's pod other than the one
// with uid not runs, and returns it.
func runningPod(ctx context.Context, t *testing.T, cp *controlplane.ControlPlane, not types.UID) *corev1.Pod {
	t.Helper()
	var (
		pods corev1.PodList
		ds   appsv1.DaemonSet
	)
	err := wait.PollUntilContextCancel(ctx, 500*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		if err := cp.Client.List(ctx, &pods, client.InNamespace("virtfleet-system"),
			client.MatchingLabels{"app.kubernetes.io/name": "virtfleet-agent"}); err != nil {
			return false, err
		}
		for _, p := range pods.Items {
			if p.UID != not && p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		_ = cp.Client.Get(ctx, client.ObjectKey{Namespace: "virtfleet-system", Name: "virtfleet-agent"}, &ds)
	}
	require.NoError(t, err, "no agent pod runs; the DaemonSet's status: %+v; pods: %+v", ds.Status, pods.Items)
	for i := range pods.Items {
		if p := &pods.Items[i]; p.UID != not && p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning {
			return p
		}
	}
	return nil
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
	return entry.Revision()
}

func mustYAML(t *testing.T, v any) string {
	t.Helper()
	b, err := yaml.Marshal(v)
	require.NoError(t, err)
	return string(b)
}
