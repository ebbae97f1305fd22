package kubenode_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtfleet/virtfleet/internal/harness/kubenode"
)

// Two linked nodes (kubenode.Link) with pod subnets of their own: a pod on
// one reaches a pod on the other at its address, and through a Service's
// cluster IP, which the first node's kube-proxy sends there.
func TestLinkedNodesPodsReachEachOther(t *testing.T) {
	cp, reg := startCluster(t)
	// kube-proxy finds a Service's pods in its EndpointSlices.
	kubenode.StartSchedulingForTest(t, cp, "endpointslice")
	a, pause := kubenode.StartForTest(t, cp, reg, "vf-link-a", func(o *kubenode.Options) { o.PodSubnet = kubenode.PodSubnet(1) })
	b, _ := kubenode.StartForTest(t, cp, reg, "vf-link-b", func(o *kubenode.Options) { o.PodSubnet = kubenode.PodSubnet(2) })
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	require.NoError(t, kubenode.Link(ctx, a, b))

	labels := map[string]string{"app": "echo"}
	server := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "echo", Namespace: "default", Labels: labels},
		Spec: corev1.PodSpec{
			NodeName:                     b.Name,
			AutomountServiceAccountToken: ptr.To(false),
			Containers:                   []corev1.Container{{Name: "echo", Image: pause, Args: []string{"-serve", ":8080", "-say", "from " + b.Name}}},
		},
	}
	require.NoError(t, cp.Client.Create(ctx, server))
	err := wait.PollUntilContextCancel(ctx, time.Second, true, func(ctx context.Context) (bool, error) {
		if err := cp.Client.Get(ctx, client.ObjectKeyFromObject(server), server); err != nil {
			return false, err
		}
		return server.Status.Phase == corev1.PodRunning && server.Status.PodIP != "", nil
	})
	require.NoError(t, err, "the server does not run; its status: %+v", server.Status)
	require.True(t, b.PodSubnet.Contains(mustAddr(t, server.Status.PodIP)), "pod %s is not in %s's subnet %s", server.Status.PodIP, b.Name, b.PodSubnet)
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "echo", Namespace: "default"},
		Spec:       corev1.ServiceSpec{Selector: labels, Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}}},
	}
	require.NoError(t, cp.Client.Create(ctx, svc))

	for name, addr := range map[string]string{"pod": server.Status.PodIP + ":8080", "service": svc.Spec.ClusterIP + ":80"} {
		t.Run("through its "+name+" address", func(t *testing.T) {
			dialer := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: "dial-" + name, Namespace: "default"},
				Spec: corev1.PodSpec{
					NodeName:                     a.Name,
					RestartPolicy:                corev1.RestartPolicyNever,
					AutomountServiceAccountToken: ptr.To(false),
					Containers: []corev1.Container{{
						Name: "dial", Image: pause, Args: []string{"-dial", addr},
						TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
					}},
				},
			}
			require.NoError(t, cp.Client.Create(ctx, dialer))
			term := awaitTerminated(ctx, t, cp, dialer)
			assert.Zero(t, term.ExitCode, term.Message)
			assert.Equal(t, "from "+b.Name, term.Message, "what the pod on %s read from %s", a.Name, addr)
		})
	}
}
