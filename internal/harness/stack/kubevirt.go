package stack

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/agent/driver/kubevirt"
	"github.com/virtfleet/virtfleet/internal/harness/kubevirttest"
)

// kubeVirtBackend is a kubevirt node's simulated KubeVirt cluster: a second
// kube-apiserver with KubeVirt's CRDs and the FakeVirtController, run
// in-process, so it outlives the node's agent.
type kubeVirtBackend struct {
	cluster *kubevirttest.Cluster
	log     *os.File
}

// startKubeVirt starts a KubeVirt test cluster for node, its kubeconfig and
// logs in dir.
func startKubeVirt(ctx context.Context, node, dir string) (Backend, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, errors.Wrapf(err, "node %s: cannot create the KubeVirt cluster's directory", node)
	}
	out, err := os.Create(filepath.Join(dir, "control-plane.log"))
	if err != nil {
		return nil, errors.Wrapf(err, "node %s: cannot create the KubeVirt cluster's log", node)
	}
	c, err := kubevirttest.Start(ctx, kubevirttest.Options{Dir: dir, Output: out})
	if err != nil {
		_ = out.Close()
		return nil, errors.Wrapf(err, "node %s: cannot start the KubeVirt test cluster", node)
	}
	return &kubeVirtBackend{cluster: c, log: out}, nil
}

// KubeVirt is the simulated KubeVirt cluster of the kubevirt node node,
// for a test to act in behind virtfleet's back; nil for any other node.
func (s *Stack) KubeVirt(node string) *kubevirttest.Cluster {
	if b, ok := s.Backends[node].(*kubeVirtBackend); ok {
		return b.cluster
	}
	return nil
}

func (b *kubeVirtBackend) AgentArgs() []string {
	// ReadWriteMany, as a cluster with shared storage makes them, so that
	// the stand-in's VMs migrate live.
	return []string{"--kubevirt-kubeconfig=" + b.cluster.Kubeconfig, "--kubevirt-namespace=" + b.cluster.Namespace, "--kubevirt-access-mode=ReadWriteMany"}
}

// Guests counts the KubeVirt VirtualMachines by their virtfleet uid label,
// read from the API server, not through the driver.
func (b *kubeVirtBackend) Guests(ctx context.Context) (map[string]int, error) {
	vms := &kubevirtv1.VirtualMachineList{}
	if err := b.cluster.Client.List(ctx, vms, client.InNamespace(b.cluster.Namespace), client.HasLabels{kubevirt.LabelUID}); err != nil {
		return nil, errors.Wrap(err, "cannot list KubeVirt VirtualMachines")
	}
	out := map[string]int{}
	for _, vm := range vms.Items {
		out[vm.Labels[kubevirt.LabelUID]]++
	}
	return out, nil
}

func (b *kubeVirtBackend) String() string {
	return fmt.Sprintf("KubeVirt test cluster at %s, namespace %s", b.cluster.Config.Host, b.cluster.Namespace)
}

func (b *kubeVirtBackend) Stop() {
	_ = b.cluster.Stop()
	_ = b.log.Close()
}
