package stack

import (
	"context"
	"path/filepath"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"

	"github.com/virtfleet/virtfleet/internal/harness/controlplane"
	"github.com/virtfleet/virtfleet/internal/harness/freeport"
	"github.com/virtfleet/virtfleet/internal/harness/manifests"
)

// registerSubresources routes the aggregated API to the hub this stack
// runs on this machine: cluster/deploy's APIService, its Service an
// ExternalName for localhost (there are no pods to select), on a port of
// this machine; the hub's grants for it (bound by cluster/deploy's
// ClusterRoleBindings, which hubIdentity applies) and its namespaced Role
// for its serving certificate; and the tenant ClusterRoles tests bind.
func (s *Stack) registerSubresources(ctx context.Context) error {
	port, err := freeport.Pick()
	if err != nil {
		return errors.Wrap(err, "cannot pick a port for the hub's aggregated API")
	}
	s.apiPort = port
	hub := filepath.Join(controlplane.RepoRoot(), "cluster", "deploy", "hub")
	api := filepath.Join(controlplane.RepoRoot(), "cluster", "deploy", "api")
	objs, err := manifests.Load(filepath.Join(hub, "role.yaml"), filepath.Join(hub, "rolebinding.yaml"),
		filepath.Join(api, "clusterrole.yaml"), filepath.Join(api, "tenant-clusterroles.yaml"), filepath.Join(api, "apiservice.yaml"))
	if err != nil {
		return err
	}
	var apply []*unstructured.Unstructured
	for _, o := range objs {
		switch o.GetKind() {
		case "Service":
			continue
		case "APIService":
			if err := unstructured.SetNestedField(o.Object, int64(port), "spec", "service", "port"); err != nil {
				return errors.Wrap(err, "cannot route the APIService to the hub's port")
			}
			s.apiService = o.GetName()
			s.apiServiceTarget, _, _ = unstructured.NestedString(o.Object, "spec", "service", "name")
		case "Role", "RoleBinding":
			o.SetNamespace(SystemNamespace)
		}
		apply = append(apply, o)
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: SystemNamespace, Name: s.apiServiceTarget},
		Spec:       corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "localhost"},
	}
	if err := s.ControlPlane.ApplyObjects(ctx, apply); err != nil {
		return err
	}
	if err := s.ControlPlane.Client.Create(ctx, svc); err != nil && !kerrors.IsAlreadyExists(err) {
		return errors.Wrap(err, "cannot create the aggregated API's Service")
	}
	return nil
}

// AwaitSubresources waits until the API server reaches the hub's aggregated
// API (its APIService Available). It fails at once when the hub has
// exited, with the end of its log.
func (s *Stack) AwaitSubresources(ctx context.Context) error {
	var last string
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		s.mu.Lock()
		hub := s.hub
		s.mu.Unlock()
		if hub != nil {
			if gone := hub.gone(); gone != nil {
				return false, gone
			}
		}
		svc := &apiregistrationv1.APIService{}
		if err := s.ControlPlane.Client.Get(ctx, types.NamespacedName{Name: s.apiService}, svc); err != nil {
			last = err.Error()
			return false, nil
		}
		for _, c := range svc.Status.Conditions {
			if c.Type == apiregistrationv1.Available {
				last = c.Reason + ": " + c.Message
				return c.Status == apiregistrationv1.ConditionTrue, nil
			}
		}
		return false, nil
	})
	return errors.Wrapf(err, "the aggregated API did not become available (%s)", last)
}

// SubresourcesPort is the port the hub serves its aggregated API on, on
// 127.0.0.1 (Options.Subresources).
func (s *Stack) SubresourcesPort() int { return s.apiPort }

// Plugin is the absolute path of the kubectl plugin (kubectl-virtfleet)
// built with the hub and the agent, so a PATH made from it works from any
// directory (make run gives its binaries as a relative path).
func (s *Stack) Plugin() string {
	p := filepath.Join(s.bin, "kubectl-virtfleet")
	if abs, err := filepath.Abs(p); err == nil {
		return abs
	}
	return p
}

// DeployedAgentCapabilities are the capabilities cluster/deploy's DaemonSet
// gives the agent's container (all others dropped), for
// LibvirtHost.Capabilities: a suite that runs its agent with them proves
// the deployed agent can do what the suite asks of it.
func DeployedAgentCapabilities() ([]string, error) {
	objs, err := manifests.Load(filepath.Join(controlplane.RepoRoot(), "cluster", "deploy", "agent", "daemonset.yaml"))
	if err != nil {
		return nil, err
	}
	for _, o := range objs {
		if o.GetKind() != "DaemonSet" {
			continue
		}
		ds := &appsv1.DaemonSet{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, ds); err != nil {
			return nil, errors.Wrap(err, "cannot read the agent's DaemonSet")
		}
		caps := []string{}
		for _, c := range ds.Spec.Template.Spec.Containers {
			if c.Name != "agent" || c.SecurityContext == nil || c.SecurityContext.Capabilities == nil {
				continue
			}
			for _, add := range c.SecurityContext.Capabilities.Add {
				caps = append(caps, string(add))
			}
			return caps, nil
		}
	}
	return nil, errors.New("cluster/deploy's DaemonSet has no container named agent with a security context")
}
