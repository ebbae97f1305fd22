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
	dto "github.com/prometheus/client_model/go"
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

	computev1alpha1 "github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/build/ociimage"
	"github.com/virtfleet/virtfleet/internal/build/providerpackage"
	"github.com/virtfleet/virtfleet/internal/harness/controlplane"
	"github.com/virtfleet/virtfleet/internal/harness/crossplanetest"
	"github.com/virtfleet/virtfleet/internal/harness/kubenode"
	"github.com/virtfleet/virtfleet/internal/harness/manifests"
	"github.com/virtfleet/virtfleet/internal/memlimit"
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
// Crossplane itself is installed as the README's step 1 says, by its own
// Helm chart (crossplanetest.InstallInCluster): its core and RBAC manager
// run as the chart's Deployments on the node and pull the provider
// package from the registry the node forwards. Every pod reaches the API
// server by the kubernetes Service (controlplane.Options.InClusterAddress).
// The API server's machine does not route to the node's pods, as no
// Service proxy runs there: the API server reaches the Services' endpoints
// (the aggregated API's, Crossplane's webhooks') through the harness's
// egress proxy into the node's network (controlplane.Options.ClusterEgress),
// as a control plane off the pod network reaches them through a
// konnectivity server.
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
		families := f.hubMetrics(t, &p)
		assert.Equal(t, []string{imageVersion}, buildVersions(families), "hub %s reports the version its image was built as", p.Name)
		// The memory limit package/install.yaml hands the hub: its Go
		// runtime keeps to its share of it.
		limit := p.Spec.Containers[0].Resources.Limits.Memory().Value()
		require.Len(t, families["go_gc_gomemlimit_bytes"].GetMetric(), 1, "hub %s reports its runtime's memory limit", p.Name)
		assert.InDelta(t, float64(limit)*memlimit.Share, families["go_gc_gomemlimit_bytes"].GetMetric()[0].GetGauge().GetValue(), 1,
			"hub %s's runtime keeps to %.0f%% of its container's %d bytes", p.Name, memlimit.Share*100, limit)
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
// image and the three packages, by reference.
type release struct {
	agent, provider, function, configuration string
}

// installPackage builds and pushes each of versions' agent image and
// packages, installs Crossplane and then the first version as the README's
// "With Crossplane's package manager" says (install.yaml, package/api and
// the size classes, then the fleet's NATS and agents and the
// ClusterProviderConfig), and waits until the three packages are Healthy,
// both hub replicas run on the node and one holds the Lease.
// The node runs real guests on real's hypervisor where it is given.
func installPackage(t *testing.T, real *realHost, versions ...string) *packageInstall {
	t.Helper()
	log.SetLogger(testr.New(t))
	buildCtx, cancelBuild := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancelBuild()
	// The API server starts with no CRDs: Crossplane installs its own,
	// and virtfleet's come with its package.
	cp := controlplane.StartForTestWith(t, controlplane.Options{InClusterAddress: kubenode.NodeIP, NoCRDs: true, Aggregation: true, ClusterEgress: true})
	reg, err := crossplanetest.StartRegistry()
	require.NoError(t, err)
	t.Cleanup(reg.Stop)

	start := time.Now()
	releases := map[string]release{}
	for _, v := range versions {
		pkgs, err := providerpackage.BuildAll(buildCtx, filepath.Join(controlplane.RepoRoot(), "package"),
			buildImage(buildCtx, t, virtfleetSpec(t, ociimage.Hub.Name, v)), buildImage(buildCtx, t, virtfleetSpec(t, ociimage.Function.Name, v)))
		require.NoError(t, err)
		sources := map[string]string{}
		for _, p := range pkgs {
			source, err := reg.Push(buildCtx, "virtfleet/"+p.Name, v, p.Image)
			require.NoError(t, err)
			// Crossplane's package manager pulls them from its pod.
			sources[p.Name] = strings.Replace(source, reg.Host, kubenode.PodsReach(reg.Host), 1)
		}
		releases[v] = release{
			agent:         pushImage(buildCtx, t, reg, virtfleetSpec(t, ociimage.Agent.Name, v), "virtfleet/virtfleet-agent", v),
			provider:      sources[crossplanetest.Provider],
			function:      sources[crossplanetest.Function],
			configuration: sources[crossplanetest.Configuration],
		}
	}
	images := map[string]string{
		"ghcr.io/virtfleet/virtfleet-agent": releases[versions[0]].agent,
		"docker.io/library/nats":            pushImage(buildCtx, t, reg, ociimage.NATS, "virtfleet/nats", "test"),
	}
	t.Logf("releases %v and NATS image built and pushed in %s", releases, time.Since(start).Round(100*time.Millisecond))

	f := startFleet(t, cp, reg, images, crossplanetest.Namespace+"_*", real)
	start = time.Now()
	x, err := crossplanetest.InstallInCluster(buildCtx, cp, reg, crossplanetest.ClusterOptions{Dir: t.TempDir(), Progress: testWriter{t}})
	require.NoError(t, err)
	t.Logf("Crossplane installed by its Helm chart and Running in %s", time.Since(start).Round(100*time.Millisecond))

	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	inst := &packageInstall{fleet: f, x: x, releases: releases, applied: time.Now()}
	f.hubCredentials(ctx, t)
	for _, obj := range installObjects(t, releases[versions[0]]) {
		require.NoError(t, cp.Client.Create(ctx, obj), "%s %s", obj.GetKind(), obj.GetName())
	}
	inst.kubectlCommand = userKubectlCommand(t.Context(), t, cp)
	inst.kubectl = outputOf(t, inst.kubectlCommand)
	inst.kubectl("apply", "-k", filepath.Join("package", "api"))
	for _, p := range []struct{ kind, name string }{
		{pkgv1.ProviderKind, crossplanetest.Provider}, {pkgv1.FunctionKind, crossplanetest.Function}, {pkgv1.ConfigurationKind, crossplanetest.Configuration},
	} {
		require.NoError(t, x.WaitPackage(ctx, p.kind, p.name, pkgv1.TypeHealthy, 5*time.Minute))
		t.Logf("%s %s Healthy %s after it was applied", p.kind, p.name, time.Since(inst.applied).Round(100*time.Millisecond))
	}
	inst.kubectl("apply", "-f", filepath.Join("package", crossplanetest.SizesFile))
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
// output, failing t if one fails. An apply or a get the API server did not
// answer in time is run again, as a user would: both are idempotent, and
// the suite's other packages load the machine's one API server host.
func outputOf(t *testing.T, command func(args ...string) *exec.Cmd) func(args ...string) string {
	return func(args ...string) string {
		t.Helper()
		var out []byte
		var err error
		for attempt := 1; ; attempt++ {
			out, err = command(args...).CombinedOutput()
			if err == nil || attempt == kubectlAttempts || !slices.Contains([]string{"apply", "get"}, args[0]) || !unanswered(string(out)) {
				break
			}
			t.Logf("kubectl %s, attempt %d: the API server did not answer in time; again: %s", strings.Join(args, " "), attempt, out)
		}
		require.NoError(t, err, "kubectl %s: %s", strings.Join(args, " "), out)
		return string(out)
	}
}

// kubectlAttempts is how many times outputOf runs an apply or a get the API
// server did not answer in time.
const kubectlAttempts = 3

// unanswered says whether kubectl's output says a request timed out
// rather than that the API server refused it.
func unanswered(out string) bool {
	for _, s := range []string{"context deadline exceeded", "Client.Timeout exceeded", "TLS handshake timeout", "the server was unable to return a response in the time allotted"} {
		if strings.Contains(out, s) {
			return true
		}
	}
	return false
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

// installObjects are package/install.yaml's objects, with rel's packages,
// as the README applies them.
func installObjects(t *testing.T, rel release) []*unstructured.Unstructured {
	t.Helper()
	objs, err := manifests.Load(filepath.Join(controlplane.RepoRoot(), "package", "install.yaml"))
	require.NoError(t, err)
	sources := map[string]string{pkgv1.ProviderKind: rel.provider, pkgv1.FunctionKind: rel.function, pkgv1.ConfigurationKind: rel.configuration}
	for _, o := range objs {
		if source, ok := sources[o.GetKind()]; ok {
			require.NoError(t, unstructured.SetNestedField(o.Object, source, "spec", "package"))
			delete(sources, o.GetKind())
		}
	}
	require.Empty(t, sources, "package/install.yaml installs no such packages")
	return objs
}

// hubMetrics are the metrics of the hub of pod, scraped from its metrics
// port (8080, which Crossplane names metrics) through the node. A pod just
// Running may not serve yet: the scrape is tried again for a while.
func (f *fleet) hubMetrics(t *testing.T, pod *corev1.Pod) map[string]*dto.MetricFamily {
	t.Helper()
	addr, err := f.node.Expose(net.JoinHostPort(pod.Status.PodIP, "8080"))
	require.NoError(t, err)
	var families map[string]*dto.MetricFamily
	err = wait.PollUntilContextTimeout(context.Background(), 500*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		var err error
		if families, err = scrape(ctx, http.DefaultClient, addr); err != nil {
			t.Logf("hub %s's metrics: %v", pod.Name, err)
			return false, nil
		}
		return true, nil
	})
	require.NoError(t, err, "hub %s serves no metrics", pod.Name)
	return families
}

// buildVersions are the versions a hub reports in its
// virtfleet_hub_build_info.
func buildVersions(families map[string]*dto.MetricFamily) []string {
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

func TestUnanswered(t *testing.T) {
	cases := map[string]struct {
		out  string
		want bool
	}{
		"TheOpenAPIDownloadTimedOut": {out: `error: error validating "package/api": error validating data: failed to download openapi: Get "https://127.0.0.1:34735/openapi/v2?timeout=32s": context deadline exceeded; if you choose to ignore these errors, turn validation off with --validate=false`, want: true},
		"TheServerTimedOut":          {out: `Error from server (Timeout): the server was unable to return a response in the time allotted, but may still be processing the request`, want: true},
		"AnInvalidObjectIsRefused":   {out: `The VirtualMachine "web" is invalid: spec.forProvider.vcpu: Invalid value: 0: must be greater than or equal to 1`},
		"ForbiddenIsRefused":         {out: `Error from server (Forbidden): virtualmachines.compute.virtfleet.io is forbidden`},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			assert.Equal(t, tc.want, unanswered(tc.out))
		})
	}
}
