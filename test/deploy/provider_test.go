package deploy_test

import (
	"context"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authorizationv1 "k8s.io/api/authorization/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	pkgv1 "github.com/crossplane/crossplane/apis/v2/pkg/v1"
	pkgv1beta1 "github.com/crossplane/crossplane/apis/v2/pkg/v1beta1"

	computev1alpha1 "github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/build/ociimage"
	"github.com/virtfleet/virtfleet/internal/build/providerpackage"
	"github.com/virtfleet/virtfleet/internal/harness/controlplane"
	"github.com/virtfleet/virtfleet/internal/harness/crossplanecore"
	"github.com/virtfleet/virtfleet/internal/harness/crossplanetest"
	"github.com/virtfleet/virtfleet/internal/harness/manifests"
)

// The hub installed as the README's "With Crossplane's package manager"
// tells a user: virtfleet's provider package, built from package/ on the
// hub's image as `make package` builds it and pushed to the registry the
// kubelet pulls from, installed by package/install.yaml's Provider and
// DeploymentRuntimeConfig into a Crossplane core with its default
// Deployment runtime. Crossplane's package manager installs the CRDs,
// makes the provider's Deployment, ServiceAccount, Service and TLS Secrets,
// and its RBAC manager binds the provider's ClusterRole to that
// ServiceAccount; the kubelet runs the hub's two replicas, one of which
// becomes leader, and a VirtualMachine the test applies is placed on the
// node, its intent applied by the agent pod and reported Running.
//
// kubectl virtfleet then works as the README says once package/api is
// applied beside install.yaml: the API server routes the aggregated API to
// the hub's pods through the Service there, the hub keeps the APIService's
// caBundle with the grants package/api binds to the provider's
// ServiceAccount, and `kubectl virtfleet stop` through the API server
// stops the VM.
//
// Crossplane's core and RBAC manager run as processes against the test's
// API server (internal/harness/crossplanetest), not as its Deployment.
// The DeploymentRuntimeConfig is install.yaml's plus what this node lacks
// (see TestAgentDaemonSetOnKubelet): the API server's address and name.
// Nor does the API server's machine route to the node's pods, as no
// Service proxy runs there: the API server reaches the Service's endpoints
// through the harness's egress proxy into the node's network
// (controlplane.Options.ClusterEgress), as a control plane off the pod
// network reaches them through a konnectivity server.
func TestProviderPackageOnKubelet(t *testing.T) {
	skipWithoutKubelet(t)
	inst := installPackage(t, nil, imageVersion)
	f, cp := inst.fleet, inst.cp
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	assertHubRoleGranted(ctx, t, cp, hubPods(ctx, t, cp)[0])
	vm := f.runVM(ctx, t, "vm")
	t.Logf("VM Running on %s %s after the Provider was applied", vm.Status.AtProvider.Node, time.Since(inst.applied).Round(100*time.Millisecond))

	// What runs where, as an upgrade needs to tell: the node's agent
	// version, from its heartbeat, in its HypervisorNode, and each hub's
	// own in its metrics.
	var hn computev1alpha1.HypervisorNode
	require.NoError(t, cp.Client.Get(ctx, client.ObjectKey{Name: node}, &hn))
	assert.Equal(t, imageVersion, hn.Status.AgentVersion, "the HypervisorNode shows its agent's version")
	for _, p := range hubPods(ctx, t, cp) {
		assert.Equal(t, []string{imageVersion}, f.hubBuildVersions(t, &p), "hub %s reports the version its image was built as", p.Name)
	}

	f.stopThroughAPI(ctx, t, inst.kubectl, vm)
	t.Logf("VM stopped through the aggregated API %s after the Provider was applied", time.Since(inst.applied).Round(100*time.Millisecond))
}

// assertHubRoleGranted asserts that the ServiceAccount the hub of pod runs
// as may do everything cluster/deploy's ClusterRole virtfleet-hub lists,
// in a tenant's namespace: Crossplane's RBAC manager grants a provider its
// own kinds without delete, and package/api must grant the rest.
func assertHubRoleGranted(ctx context.Context, t *testing.T, cp *controlplane.ControlPlane, pod corev1.Pod) {
	t.Helper()
	objs, err := manifests.Load(filepath.Join(controlplane.RepoRoot(), "cluster", "deploy", "hub", "clusterrole.yaml"))
	require.NoError(t, err)
	require.Len(t, objs, 1)
	var role rbacv1.ClusterRole
	require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(objs[0].Object, &role))
	var what []authorizationv1.ResourceAttributes
	for _, r := range role.Rules {
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				resource, sub, _ := strings.Cut(res, "/")
				for _, v := range r.Verbs {
					what = append(what, authorizationv1.ResourceAttributes{Namespace: "tenant", Group: g, Resource: resource, Subresource: sub, Verb: v})
				}
			}
		}
	}
	require.NotEmpty(t, what)
	user := "system:serviceaccount:" + pod.Namespace + ":" + pod.Spec.ServiceAccountName
	wait, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	require.NoError(t, cp.AwaitAllowed(wait, user, what...), "the hub installed from its package may not do what its ClusterRole lists")
}

// packageInstall is virtfleet installed from its provider package as the
// README says, the hub's two replicas running and one of them leading.
type packageInstall struct {
	*fleet
	x *crossplanetest.Crossplane
	// releases are what was built and pushed of each version installPackage
	// was given, the first installed.
	releases map[string]release
	// kubectl runs kubectl as the README's commands are run (userKubectl);
	// kubectlCommand makes such a run's command (userKubectlCommand).
	kubectl        func(args ...string) string
	kubectlCommand func(args ...string) *exec.Cmd
	// applied is when the Provider was applied.
	applied time.Time
}

// release is one version of virtfleet as a user pulls it: the agent's
// image and the provider package, by reference.
type release struct {
	agent, provider string
}

// installPackage builds and pushes each of versions' agent image and
// provider package, installs the first as the README's "With Crossplane's
// package manager" says (install.yaml, package/api, then the fleet's NATS
// and agents and the ClusterProviderConfig), and waits until the Provider
// is Healthy, both hub replicas run on the node and one holds the Lease.
// The node runs real guests on real's hypervisor where it is given.
func installPackage(t *testing.T, real *realHost, versions ...string) *packageInstall {
	t.Helper()
	log.SetLogger(testr.New(t))
	buildCtx, cancelBuild := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancelBuild()
	core, err := crossplanecore.Ensure(buildCtx, testWriter{t})
	require.NoError(t, err)
	// The API server starts with Crossplane's CRDs alone: virtfleet's come
	// with its package.
	cp := controlplane.StartForTestWith(t, controlplane.Options{InClusterName: inClusterName, CRDDirs: []string{core.CRDs}, Aggregation: true, ClusterEgress: true})
	x, err := crossplanetest.Start(buildCtx, cp, crossplanetest.Options{Dir: t.TempDir(), Progress: testWriter{t}, DeploymentRuntime: true})
	require.NoError(t, err)
	t.Cleanup(x.Stop)

	start := time.Now()
	releases := map[string]release{}
	for _, v := range versions {
		pkg, _, err := providerpackage.Build(buildCtx, filepath.Join(controlplane.RepoRoot(), "package"), buildImage(buildCtx, t, virtfleetSpec(t, ociimage.Hub.Name, v)))
		require.NoError(t, err)
		source, err := x.Registry.Push(buildCtx, "virtfleet/"+crossplanetest.Provider, v, pkg)
		require.NoError(t, err)
		releases[v] = release{
			agent:    pushImage(buildCtx, t, x.Registry, virtfleetSpec(t, ociimage.Agent.Name, v), "virtfleet/virtfleet-agent", v),
			provider: source,
		}
	}
	images := map[string]string{
		"ghcr.io/virtfleet/virtfleet-agent": releases[versions[0]].agent,
		"docker.io/library/nats":            pushImage(buildCtx, t, x.Registry, ociimage.NATS, "virtfleet/nats", "test"),
	}
	t.Logf("releases %v and NATS image built and pushed in %s", releases, time.Since(start).Round(100*time.Millisecond))

	f := startFleet(t, cp, x.Registry, images, crossplanetest.Namespace+"_"+crossplanetest.Provider+"-*", real)

	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	inst := &packageInstall{fleet: f, x: x, releases: releases, applied: time.Now()}
	f.hubCredentials(ctx, t)
	for _, obj := range installObjects(t, f, releases[versions[0]].provider) {
		require.NoError(t, cp.Client.Create(ctx, obj), "%s %s", obj.GetKind(), obj.GetName())
	}
	inst.kubectlCommand = userKubectlCommand(t.Context(), t, cp)
	inst.kubectl = outputOf(t, inst.kubectlCommand)
	inst.kubectl("apply", "-k", filepath.Join("package", "api"))
	require.NoError(t, x.WaitPackage(ctx, pkgv1.ProviderKind, crossplanetest.Provider, pkgv1.TypeHealthy, 5*time.Minute))
	t.Logf("Provider %s Healthy %s after it was applied", crossplanetest.Provider, time.Since(inst.applied).Round(100*time.Millisecond))
	hubs := hubPods(ctx, t, cp)
	require.Len(t, hubs, 2, "the DeploymentRuntimeConfig asks for two replicas of the hub: %v", hubs)
	for _, p := range hubs {
		assert.Equal(t, node, p.Spec.NodeName, p.Name)
		assert.Equal(t, corev1.PodRunning, p.Status.Phase, p.Name)
	}
	leader := awaitLeader(ctx, t, cp, hubs)
	t.Logf("hub %s leader %s after the Provider was applied", leader, time.Since(inst.applied).Round(100*time.Millisecond))
	f.applyProviderConfig(ctx, t)
	return inst
}

// userKubectl returns what runs the machine's kubectl with args as the
// test's administrator (userKubectlCommand), each run returning its
// output.
func userKubectl(ctx context.Context, t *testing.T, cp *controlplane.ControlPlane) func(args ...string) string {
	t.Helper()
	return outputOf(t, userKubectlCommand(ctx, t, cp))
}

// outputOf returns what runs command's commands, each returning its
// output, failing t if one fails.
func outputOf(t *testing.T, command func(args ...string) *exec.Cmd) func(args ...string) string {
	return func(args ...string) string {
		t.Helper()
		out, err := command(args...).CombinedOutput()
		require.NoError(t, err, "kubectl %s: %s", strings.Join(args, " "), out)
		return string(out)
	}
}

// userKubectlCommand returns what makes the command of the machine's
// kubectl with args as the test's administrator, from the repository's
// root, as the README's commands are run, with kubectl-virtfleet, built
// from this tree, on its PATH as a user installs the plugin.
func userKubectlCommand(ctx context.Context, t *testing.T, cp *controlplane.ControlPlane) func(args ...string) *exec.Cmd {
	t.Helper()
	bin := t.TempDir()
	build := exec.CommandContext(ctx, "go", "build", "-o", bin+string(filepath.Separator), "./kubectl-virtfleet")
	build.Dir = controlplane.RepoRoot()
	out, err := build.CombinedOutput()
	require.NoError(t, err, "cannot build kubectl-virtfleet: %s", out)
	return func(args ...string) *exec.Cmd {
		cmd := exec.CommandContext(ctx, "kubectl", args...)
		cmd.Dir = controlplane.RepoRoot()
		cmd.Env = append(os.Environ(), "KUBECONFIG="+cp.Kubeconfig, "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"))
		return cmd
	}
}

// awaitAPIService waits until the API server reaches the hub's aggregated
// API: its APIService Available, which the API server says only once the
// Service has ready endpoints at the port it targets and the hub answered
// there with a certificate of the APIService's caBundle.
func awaitAPIService(ctx context.Context, t *testing.T, cp *controlplane.ControlPlane) {
	t.Helper()
	var svc apiregistrationv1.APIService
	err := wait.PollUntilContextCancel(ctx, time.Second, true, func(ctx context.Context) (bool, error) {
		if err := cp.Client.Get(ctx, client.ObjectKey{Name: "v1alpha1.subresources.virtfleet.io"}, &svc); err != nil {
			return false, client.IgnoreNotFound(err)
		}
		for _, c := range svc.Status.Conditions {
			if c.Type == apiregistrationv1.Available {
				return c.Status == apiregistrationv1.ConditionTrue, nil
			}
		}
		return false, nil
	})
	require.NoError(t, err, "the aggregated API is not available: %+v", svc.Status.Conditions)
}

// installObjects are package/install.yaml's Provider, with source for its
// package, and its DeploymentRuntimeConfig, with what the hub's pods need
// on this node to reach the API server (fleet.inCluster); the Function
// and Configuration, which this test does not run, are left out.
func installObjects(t *testing.T, f *fleet, source string) []*unstructured.Unstructured {
	t.Helper()
	objs, err := manifests.Load(filepath.Join(controlplane.RepoRoot(), "package", "install.yaml"))
	require.NoError(t, err)
	var out []*unstructured.Unstructured
	for _, o := range objs {
		switch o.GetKind() {
		case pkgv1.ProviderKind:
			require.NoError(t, unstructured.SetNestedField(o.Object, source, "spec", "package"))
		case pkgv1beta1.DeploymentRuntimeConfigKind:
			var drc pkgv1beta1.DeploymentRuntimeConfig
			require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &drc))
			tmpl := drc.Spec.DeploymentTemplate
			require.NotNil(t, tmpl, "the DeploymentRuntimeConfig has no deploymentTemplate")
			require.NotNil(t, tmpl.Spec, "the DeploymentRuntimeConfig's deploymentTemplate has no spec")
			pod := &tmpl.Spec.Template.Spec
			require.Len(t, pod.Containers, 1)
			env, aliases := f.inCluster(t)
			for k, v := range env {
				pod.Containers[0].Env = append(pod.Containers[0].Env, corev1.EnvVar{Name: k, Value: v})
			}
			pod.HostAliases = append(pod.HostAliases, aliases...)
			u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&drc)
			require.NoError(t, err)
			o = &unstructured.Unstructured{Object: u}
		default:
			continue
		}
		out = append(out, o)
	}
	require.Len(t, out, 2, "package/install.yaml lacks the Provider or its DeploymentRuntimeConfig")
	return out
}

// hubBuildVersions are the versions the hub of pod reports in its
// virtfleet_hub_build_info, scraped from its metrics port (8080, which
// Crossplane names metrics) through the node.
func (f *fleet) hubBuildVersions(t *testing.T, pod *corev1.Pod) []string {
	t.Helper()
	addr, err := f.node.Expose(net.JoinHostPort(pod.Status.PodIP, "8080"))
	require.NoError(t, err)
	req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, "http://"+addr+"/metrics", nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close() //nolint:errcheck // read-only body
	require.Equal(t, http.StatusOK, resp.StatusCode)
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	require.NoError(t, err)
	var versions []string
	for _, m := range families["virtfleet_hub_build_info"].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "version" && m.GetGauge().GetValue() == 1 {
				versions = append(versions, l.GetValue())
			}
		}
	}
	return versions
}

// hubPods are the provider's pods, which Crossplane's Deployment runtime
// labels with the provider's name.
func hubPods(ctx context.Context, t *testing.T, cp *controlplane.ControlPlane) []corev1.Pod {
	t.Helper()
	var pods corev1.PodList
	require.NoError(t, cp.Client.List(ctx, &pods, client.InNamespace(crossplanetest.Namespace),
		client.MatchingLabels{"pkg.crossplane.io/provider": crossplanetest.Provider}))
	return slices.DeleteFunc(pods.Items, func(p corev1.Pod) bool { return p.DeletionTimestamp != nil })
}

// awaitLeader waits until one of pods holds the hub's leader election
// Lease, which is in the hub's namespace (Crossplane's, from
// POD_NAMESPACE), and returns the holder's pod name.
func awaitLeader(ctx context.Context, t *testing.T, cp *controlplane.ControlPlane, pods []corev1.Pod) string {
	t.Helper()
	var lease coordinationv1.Lease
	holder := ""
	err := wait.PollUntilContextCancel(ctx, 500*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		if err := cp.Client.Get(ctx, client.ObjectKey{Namespace: crossplanetest.Namespace, Name: "virtfleet-hub"}, &lease); err != nil {
			return false, client.IgnoreNotFound(err)
		}
		if lease.Spec.HolderIdentity == nil {
			return false, nil
		}
		// controller-runtime's identity is the host name (the pod's) and a
		// suffix of its own.
		holder, _, _ = strings.Cut(*lease.Spec.HolderIdentity, "_")
		return slices.ContainsFunc(pods, func(p corev1.Pod) bool { return p.Name == holder }), nil
	})
	require.NoError(t, err, "none of the hub's pods became leader: %+v", lease.Spec)
	return holder
}
