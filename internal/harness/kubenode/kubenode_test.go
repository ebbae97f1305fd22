package kubenode_test

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtfleet/virtfleet/internal/harness/controlplane"
	"github.com/virtfleet/virtfleet/internal/harness/crossplanetest"
	"github.com/virtfleet/virtfleet/internal/harness/envtestassets"
	"github.com/virtfleet/virtfleet/internal/harness/kubenode"
)

// A node registers and becomes Ready, runs pods of an image from the test's
// registry to completion (their exit status, and on failure their log, come
// back through the API server) and a DaemonSet's pod, placed by a real
// scheduler, and Stop leaves no process, cgroup, namespace or directory
// behind.
func TestNodeRunsPods(t *testing.T) {
	cp, reg := startCluster(t)

	start := time.Now()
	n, pause := kubenode.StartForTest(t, cp, reg, "vf-node-a")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	var node corev1.Node
	err := wait.PollUntilContextCancel(ctx, time.Second, true, func(ctx context.Context) (bool, error) {
		if err := n.Exited(); err != nil {
			return false, err
		}
		if err := cp.Client.Get(ctx, client.ObjectKey{Name: n.Name}, &node); err != nil {
			return false, nil //nolint:nilerr // not registered yet
		}
		return ready(&node), nil
	})
	require.NoError(t, err, "node %s not Ready; its conditions: %+v", n.Name, node.Status.Conditions)
	t.Logf("node %s Ready %s after it started", n.Name, time.Since(start).Round(time.Second))
	assert.Equal(t, envtestassets.KubernetesVersion, node.Status.NodeInfo.KubeletVersion)
	assert.Contains(t, node.Status.NodeInfo.ContainerRuntimeVersion, "containerd://")

	cases := []struct {
		name        string
		exit        int
		wantPhase   corev1.PodPhase
		wantMessage string
	}{
		{name: "succeeds", exit: 0, wantPhase: corev1.PodSucceeded},
		{name: "fails", exit: 3, wantPhase: corev1.PodFailed, wantMessage: "said by a failing pod\n"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pod := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: "probe-" + tc.name, Namespace: "default"},
				Spec: corev1.PodSpec{
					NodeName:                     n.Name, // there is no scheduler
					RestartPolicy:                corev1.RestartPolicyNever,
					AutomountServiceAccountToken: ptr.To(false),
					Containers: []corev1.Container{{
						Name:  "probe",
						Image: pause,
						Args:  []string{"-exit", fmt.Sprint(tc.exit), "-say", "said by a failing pod"},
						// On failure the kubelet reads the end of the
						// container's log into its status.
						TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
					}},
				},
			}
			require.NoError(t, cp.Client.Create(ctx, pod))
			term := awaitTerminated(ctx, t, cp, pod)
			assert.Equal(t, tc.wantPhase, pod.Status.Phase)
			assert.EqualValues(t, tc.exit, term.ExitCode)
			assert.Equal(t, tc.wantMessage, term.Message)
		})
	}

	t.Run("a DaemonSet's pod runs on the node", func(t *testing.T) {
		// The node lifecycle controller lifts the not-ready taint the
		// kubelet registers its node with, which a DaemonSet's pods do
		// not tolerate.
		kubenode.StartSchedulingForTest(t, cp, "daemonset", "nodelifecycle")
		labels := map[string]string{"app": "probe-daemon"}
		ds := &appsv1.DaemonSet{
			ObjectMeta: metav1.ObjectMeta{Name: "probe-daemon", Namespace: "default"},
			Spec: appsv1.DaemonSetSpec{
				Selector: &metav1.LabelSelector{MatchLabels: labels},
				Template: corev1.PodTemplateSpec{
					ObjectMeta: metav1.ObjectMeta{Labels: labels},
					Spec: corev1.PodSpec{
						AutomountServiceAccountToken: ptr.To(false),
						Containers:                   []corev1.Container{{Name: "pause", Image: pause}},
					},
				},
			},
		}
		require.NoError(t, cp.Client.Create(ctx, ds))
		var pods corev1.PodList
		err := wait.PollUntilContextCancel(ctx, time.Second, true, func(ctx context.Context) (bool, error) {
			if err := cp.Client.List(ctx, &pods, client.InNamespace("default"), client.MatchingLabels(labels)); err != nil {
				return false, err
			}
			return len(pods.Items) == 1 && pods.Items[0].Status.Phase == corev1.PodRunning, nil
		})
		if err != nil {
			_ = cp.Client.Get(ctx, client.ObjectKeyFromObject(ds), ds)
		}
		require.NoError(t, err, "the DaemonSet's pod does not run; its status: %+v; pods: %+v", ds.Status, pods.Items)
		assert.Equal(t, n.Name, pods.Items[0].Spec.NodeName)
	})

	n.Stop()
	ns, err := exec.Command("ip", "netns", "list").Output()
	require.NoError(t, err)
	assert.NotContains(t, string(ns), n.Netns)
	_, err = os.Stat(n.Dir)
	assert.True(t, os.IsNotExist(err), "%s is left", n.Dir)
	cgroups, err := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", n.Cgroup))
	require.NoError(t, err)
	assert.Empty(t, cgroups, "cgroups are left")
}

func ready(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// startCluster skips t where a node cannot run, and starts a control plane
// and a registry for t's nodes.
func startCluster(t *testing.T) (*controlplane.ControlPlane, *crossplanetest.Registry) {
	t.Helper()
	if m := kubenode.Missing(); len(m) > 0 {
		t.Skipf("needs %v (make deps, as root)", m)
	}
	cp := controlplane.StartForTest(t)
	reg, err := crossplanetest.StartRegistry()
	require.NoError(t, err)
	t.Cleanup(reg.Stop)
	return cp, reg
}

// awaitTerminated waits until pod, of one container, ended, and returns
// how the container did; pod is left as read.
func awaitTerminated(ctx context.Context, t *testing.T, cp *controlplane.ControlPlane, pod *corev1.Pod) *corev1.ContainerStateTerminated {
	t.Helper()
	err := wait.PollUntilContextCancel(ctx, time.Second, true, func(ctx context.Context) (bool, error) {
		if err := cp.Client.Get(ctx, client.ObjectKeyFromObject(pod), pod); err != nil {
			return false, err
		}
		return pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed, nil
	})
	require.NoError(t, err, "pod %s did not end; its status: %+v", pod.Name, pod.Status)
	require.Len(t, pod.Status.ContainerStatuses, 1)
	term := pod.Status.ContainerStatuses[0].State.Terminated
	require.NotNil(t, term, "container status: %+v", pod.Status.ContainerStatuses[0])
	return term
}

// mustAddr parses an IP address.
func mustAddr(t *testing.T, s string) netip.Addr {
	t.Helper()
	a, err := netip.ParseAddr(s)
	require.NoError(t, err)
	return a
}
