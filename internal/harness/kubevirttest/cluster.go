package kubevirttest

import (
	"context"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/internal/harness/controlplane"
)

// DefaultNamespace is where a Cluster's VirtualMachines live unless Options
// say otherwise.
const DefaultNamespace = "virtfleet"

// Node is a Node object of the simulated cluster, labelled
// kubernetes.io/hostname with its name and with an InternalIP in
// 10.199.0.0/24.
type Node struct {
	Name string
	// CPU and Memory are the node's allocatable resources.
	CPU, Memory resource.Quantity
	// Unschedulable cordons the node; NotReady marks it not Ready.
	Unschedulable, NotReady bool
}

// DefaultNodes are two schedulable nodes of 8 CPUs and 32 GiB each, a
// cordoned one and one that is not Ready: 16 CPUs and 64 GiB to schedule on.
func DefaultNodes() []Node {
	return []Node{
		{Name: "kv-node-a", CPU: resource.MustParse("8"), Memory: resource.MustParse("32Gi")},
		{Name: "kv-node-b", CPU: resource.MustParse("8"), Memory: resource.MustParse("32Gi")},
		{Name: "kv-node-cordoned", CPU: resource.MustParse("64"), Memory: resource.MustParse("256Gi"), Unschedulable: true},
		{Name: "kv-node-notready", CPU: resource.MustParse("64"), Memory: resource.MustParse("256Gi"), NotReady: true},
	}
}

// Options configure a Cluster. Zero values take the defaults.
type Options struct {
	// Dir holds the kubeconfig and the API server's certificates. Required.
	Dir string
	// Progress receives messages while binaries are built for the first time.
	Progress io.Writer
	// Output, if set, receives the API server's and etcd's logs.
	Output io.Writer
	// Namespace is created for the VirtualMachines; default DefaultNamespace.
	Namespace string
	// Nodes default to DefaultNodes.
	Nodes []Node
	// StepInterval is how long each VMI phase, and each step of a
	// DataVolume's import, lasts; default 100 ms.
	StepInterval time.Duration
}

// Cluster is a running simulated KubeVirt cluster.
type Cluster struct {
	*controlplane.ControlPlane
	// Namespace holds the VirtualMachines.
	Namespace string
	// Controller plays KubeVirt; tests force failures through it.
	Controller *FakeVirtController
	// CDI plays CDI's DataVolume controller and importer; tests read what
	// it imported through it.
	CDI *FakeCDI

	virtAPI *virtAPI
	cancel  context.CancelFunc
	done    chan error
}

// Start starts the control plane with KubeVirt's CRDs, creates the
// namespace and the Nodes, registers the subresource API (pause, unpause,
// console, vnc) and starts the FakeVirtController and the FakeCDI. The API
// server can be stopped and started again (StopAPIServer, StartAPIServer).
func Start(ctx context.Context, o Options) (*Cluster, error) {
	if o.Namespace == "" {
		o.Namespace = DefaultNamespace
	}
	if o.Nodes == nil {
		o.Nodes = DefaultNodes()
	}
	if o.StepInterval == 0 {
		o.StepInterval = 100 * time.Millisecond
	}
	crds, err := CRDs()
	if err != nil {
		return nil, err
	}
	cp, err := controlplane.Start(ctx, controlplane.Options{
		Dir: o.Dir, Progress: o.Progress, Output: o.Output,
		CRDs: crds, AddToScheme: AddToScheme, Restartable: true,
	})
	if err != nil {
		return nil, err
	}
	c := &Cluster{ControlPlane: cp, Namespace: o.Namespace, done: make(chan error, 1)}
	if err := c.populate(ctx, o); err != nil {
		_ = cp.Stop()
		return nil, err
	}
	if c.virtAPI, err = startVirtAPI(ctx, cp.Client); err != nil {
		_ = cp.Stop()
		return nil, err
	}
	mgr, err := ctrl.NewManager(cp.Config, ctrl.Options{
		Scheme:                 cp.Scheme,
		Logger:                 logr.Discard(),
		Metrics:                server.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
	})
	if err != nil {
		_ = cp.Stop()
		c.virtAPI.close()
		return nil, errors.Wrap(err, "cannot create the fake virt-controller's manager")
	}
	mctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	if c.Controller, err = setupController(mgr, o.StepInterval); err == nil {
		c.CDI, err = setupCDI(mctx, mgr, o.StepInterval)
	}
	if err != nil {
		cancel()
		_ = cp.Stop()
		c.virtAPI.close()
		return nil, err
	}
	c.cancel = cancel
	go func() { c.done <- mgr.Start(mctx) }()
	return c, nil
}

func (c *Cluster) populate(ctx context.Context, o Options) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: o.Namespace}}
	if err := c.Client.Create(ctx, ns); err != nil && !kerrors.IsAlreadyExists(err) {
		return errors.Wrap(err, "cannot create the namespace")
	}
	for i, n := range o.Nodes {
		// The label and addresses a kubelet registers its node with.
		node := &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: n.Name, Labels: map[string]string{corev1.LabelHostname: n.Name}},
			Spec:       corev1.NodeSpec{Unschedulable: n.Unschedulable},
		}
		if err := c.Client.Create(ctx, node); err != nil {
			return errors.Wrapf(err, "cannot create node %s", n.Name)
		}
		ready := corev1.ConditionTrue
		if n.NotReady {
			ready = corev1.ConditionFalse
		}
		resources := corev1.ResourceList{corev1.ResourceCPU: n.CPU, corev1.ResourceMemory: n.Memory, corev1.ResourcePods: resource.MustParse("110")}
		node.Status = corev1.NodeStatus{
			Capacity:    resources,
			Allocatable: resources,
			Conditions:  []corev1.NodeCondition{{Type: corev1.NodeReady, Status: ready, Reason: "FakeVirtController", LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}},
			Addresses: []corev1.NodeAddress{
				{Type: corev1.NodeInternalIP, Address: fmt.Sprintf("10.199.0.%d", i+1)},
				{Type: corev1.NodeHostName, Address: n.Name},
			},
		}
		if err := c.Client.Status().Update(ctx, node); err != nil {
			return errors.Wrapf(err, "cannot set the status of node %s", n.Name)
		}
	}
	return nil
}

// Stop stops the FakeVirtController, the FakeCDI (and its downloads) and the
// control plane. The API server
// is killed rather than drained, as StopAPIServer does.
func (c *Cluster) Stop() error {
	c.cancel()
	err := <-c.done
	err = errors.Join(err, c.StopAPIServer(), c.ControlPlane.Stop())
	c.virtAPI.close()
	return err
}

// StartForTest starts a Cluster for one test (or one package, from TestMain)
// and stops it at cleanup. It fails the test when the cluster cannot start.
func StartForTest(t testing.TB, o Options) *Cluster {
	t.Helper()
	if o.Dir == "" {
		o.Dir = t.TempDir()
	}
	c, err := Start(context.Background(), o)
	if err != nil {
		t.Fatalf("cannot start the KubeVirt test cluster: %v", err)
	}
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Errorf("cannot stop the KubeVirt test cluster: %v", err)
		}
	})
	return c
}
