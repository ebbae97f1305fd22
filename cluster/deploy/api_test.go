package deploy_test

import (
	"context"
	"io"
	"maps"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	"k8s.io/utils/ptr"

	pkgv1beta1 "github.com/crossplane/crossplane/apis/v2/pkg/v1beta1"

	"github.com/virtfleet/virtfleet/internal/harness/envtestassets"
	"github.com/virtfleet/virtfleet/internal/harness/manifests"
)

// hubPod is what the aggregated API's wiring needs to know of the pods a
// way of installing runs the hub in.
type hubPod struct {
	labels map[string]string
	// namespace and serviceAccount are where the pods run and as whom.
	namespace, serviceAccount string
	container                 corev1.Container
}

// TestTheAPIServiceReachesEveryHub pins the wiring of kubectl virtfleet's
// aggregated API for each way of installing the hub, as a user applies
// it: the APIService routes to the Service, the Service selects the hub's
// pods and targets the port they serve the API on, and the hub's
// ServiceAccount is bound the grants it needs for it. A hub that Crossplane's
// package manager runs gets its pods from package/install.yaml's
// DeploymentRuntimeConfig, in Crossplane's namespace, and the API from
// package/api.
func TestTheAPIServiceReachesEveryHub(t *testing.T) {
	assets, err := envtestassets.Ensure(context.Background(), io.Discard)
	require.NoError(t, err)
	kubectl := filepath.Join(assets, "kubectl")

	deploy := kustomize(t, kubectl, ".")
	d := rendered[appsv1.Deployment](t, deploy, "Deployment", "virtfleet-hub")
	require.Len(t, d.Spec.Template.Spec.Containers, 1)

	drc := providerRuntimeConfig(t)
	require.NotNil(t, drc.Spec.ServiceAccountTemplate, "the provider's ServiceAccount has a name of its own, for package/api to bind")
	require.NotNil(t, drc.Spec.ServiceAccountTemplate.Metadata)
	tmpl := drc.Spec.DeploymentTemplate.Spec.Template
	require.Len(t, tmpl.Spec.Containers, 1)
	pkgAPI := kustomize(t, kubectl, filepath.Join("..", "..", "package", "api"))

	cases := map[string]struct {
		objs []*unstructured.Unstructured
		pod  hubPod
	}{
		"cluster/deploy": {deploy, hubPod{
			labels: d.Spec.Template.Labels, namespace: d.Namespace,
			serviceAccount: d.Spec.Template.Spec.ServiceAccountName, container: d.Spec.Template.Spec.Containers[0],
		}},
		// Crossplane runs the provider in its own namespace, which
		// package/api names, and adds labels of its own to the pods.
		"provider package": {pkgAPI, hubPod{
			labels: tmpl.Labels, namespace: rendered[corev1.Service](t, pkgAPI, "Service", "virtfleet-hub-api").Namespace,
			serviceAccount: ptr.Deref(drc.Spec.ServiceAccountTemplate.Metadata.Name, ""), container: tmpl.Spec.Containers[0],
		}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			apisvc := rendered[apiregistrationv1.APIService](t, tc.objs, "APIService", "v1alpha1.subresources.virtfleet.io")
			require.NotNil(t, apisvc.Spec.Service)
			svc := rendered[corev1.Service](t, tc.objs, "Service", apisvc.Spec.Service.Name)
			assert.Equal(t, tc.pod.namespace, svc.Namespace, "the Service is in the hub's namespace")
			assert.Equal(t, svc.Namespace, apisvc.Spec.Service.Namespace, "the APIService routes to the Service")
			require.NotEmpty(t, svc.Spec.Selector)
			assert.Subset(t, tc.pod.labels, svc.Spec.Selector, "the Service selects the hub's pods")

			require.NotNil(t, apisvc.Spec.Service.Port)
			i := slices.IndexFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Port == *apisvc.Spec.Service.Port })
			require.GreaterOrEqual(t, i, 0, "the Service has the APIService's port")
			target := svc.Spec.Ports[i].TargetPort.String()
			j := slices.IndexFunc(tc.pod.container.Ports, func(p corev1.ContainerPort) bool { return p.Name == target })
			require.GreaterOrEqual(t, j, 0, "the hub's container has the port %s the Service targets", target)
			assert.Contains(t, tc.pod.container.Args, "--api-bind-address=:"+strconv.Itoa(int(tc.pod.container.Ports[j].ContainerPort)),
				"the hub serves the API on the port the Service targets")

			bound := false
			for _, b := range renderedAll[rbacv1.ClusterRoleBinding](t, tc.objs, "ClusterRoleBinding") {
				if b.RoleRef.Name != "virtfleet-hub-api" {
					continue
				}
				bound = bound || slices.Contains(b.Subjects, rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: tc.pod.serviceAccount, Namespace: tc.pod.namespace})
			}
			assert.True(t, bound, "virtfleet-hub-api is bound to the hub's ServiceAccount %s/%s", tc.pod.namespace, tc.pod.serviceAccount)
			rendered[rbacv1.ClusterRole](t, tc.objs, "ClusterRole", "virtfleet-hub-api")
			for _, role := range []string{"virtfleet-vm-console", "virtfleet-vm-power"} {
				rendered[rbacv1.ClusterRole](t, tc.objs, "ClusterRole", role)
			}
		})
	}
}

// providerRuntimeConfig is the DeploymentRuntimeConfig package/install.yaml's
// Provider names.
func providerRuntimeConfig(t *testing.T) *pkgv1beta1.DeploymentRuntimeConfig {
	t.Helper()
	objs, err := manifests.Load(filepath.Join("..", "..", "package", "install.yaml"))
	require.NoError(t, err)
	ref := ""
	for _, o := range objs {
		if o.GetKind() == "Provider" {
			ref, _, err = unstructured.NestedString(o.Object, "spec", "runtimeConfigRef", "name")
			require.NoError(t, err)
		}
	}
	require.NotEmpty(t, ref, "the Provider names its runtime config")
	drc := &pkgv1beta1.DeploymentRuntimeConfig{}
	for _, o := range objs {
		if o.GetKind() == pkgv1beta1.DeploymentRuntimeConfigKind && o.GetName() == ref {
			require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, drc))
		}
	}
	require.NotNil(t, drc.Spec.DeploymentTemplate, "DeploymentRuntimeConfig %s has no deploymentTemplate", ref)
	require.NotNil(t, drc.Spec.DeploymentTemplate.Spec, "DeploymentRuntimeConfig %s has no deploymentTemplate.spec", ref)
	return drc
}

// rendered is the object of kind and name among objs.
func rendered[T any](t *testing.T, objs []*unstructured.Unstructured, kind, name string) *T {
	t.Helper()
	i := slices.IndexFunc(objs, func(o *unstructured.Unstructured) bool { return o.GetKind() == kind && o.GetName() == name })
	require.GreaterOrEqual(t, i, 0, "%s %s is not among %s", kind, name, strings.Join(slices.Sorted(maps.Keys(names(objs))), ", "))
	out := new(T)
	require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(objs[i].Object, out))
	return out
}

// renderedAll are the objects of kind among objs.
func renderedAll[T any](t *testing.T, objs []*unstructured.Unstructured, kind string) []*T {
	t.Helper()
	var out []*T
	for _, o := range objs {
		if o.GetKind() == kind {
			out = append(out, rendered[T](t, []*unstructured.Unstructured{o}, kind, o.GetName()))
		}
	}
	return out
}

func names(objs []*unstructured.Unstructured) map[string]bool {
	out := map[string]bool{}
	for _, o := range objs {
		out[o.GetKind()+" "+o.GetName()] = true
	}
	return out
}
