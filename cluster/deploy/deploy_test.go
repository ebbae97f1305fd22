// Package deploy_test checks the manifests of cluster/deploy for the
// properties the deployment promises: least-privilege RBAC, an agent without
// Kubernetes credentials that reaches the host's libvirt socket, and a hub
// with probes and leader election.
package deploy_test

import (
	"cmp"
	"context"
	"io"
	"net"
	"os"
	"os/exec"
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
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/virtfleet/virtfleet/internal/flagenv"
	"github.com/virtfleet/virtfleet/internal/harness/envtestassets"
	"github.com/virtfleet/virtfleet/internal/harness/manifests"
	"github.com/virtfleet/virtfleet/internal/memlimit"
)

// objects loads every manifest of the directory (the kustomization excluded)
// by kind.
func objects(t *testing.T) map[string][]*unstructured.Unstructured {
	t.Helper()
	objs, err := manifests.Load(".")
	require.NoError(t, err)
	byKind := map[string][]*unstructured.Unstructured{}
	for _, o := range objs {
		byKind[o.GetKind()] = append(byKind[o.GetKind()], o)
	}
	return byKind
}

func one[T any](t *testing.T, byKind map[string][]*unstructured.Unstructured, kind, name string) *T {
	t.Helper()
	for _, o := range byKind[kind] {
		if o.GetName() == name {
			out := new(T)
			require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, out))
			return out
		}
	}
	require.Failf(t, "missing object", "%s %s", kind, name)
	return nil
}

// TestKustomizationListsEveryManifest pins that `kubectl apply -k` applies
// every file of each kustomization a user applies (cluster/deploy, and
// package/api beside the provider package), and that each listed file
// exists.
func TestKustomizationListsEveryManifest(t *testing.T) {
	cases := map[string]struct{ dir, namespace string }{
		"cluster/deploy": {dir: ".", namespace: "virtfleet-system"},
		"package/api":    {dir: filepath.Join("..", "..", "package", "api"), namespace: "crossplane-system"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			assertListsEveryManifest(t, tc.dir)
			if _, err := exec.LookPath("kubectl"); err != nil {
				t.Log("kubectl not found; the kustomization is not rendered")
				return
			}
			out, err := exec.Command("kubectl", "kustomize", tc.dir).CombinedOutput()
			require.NoError(t, err, string(out))
			assert.Contains(t, string(out), "namespace: "+tc.namespace)
		})
	}
}

// assertListsEveryManifest checks that dir's kustomization lists every
// .yaml file below dir, each directory it lists being a kustomization
// that does the same for the files below it.
func assertListsEveryManifest(t *testing.T, dir string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml")) //nolint:gosec // the repository's
	require.NoError(t, err)
	var k struct {
		Resources []string `json:"resources"`
	}
	require.NoError(t, yaml.Unmarshal(b, &k))
	var files, dirs []string
	require.NoError(t, filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		switch {
		case d.IsDir() && rel != "." && slices.Contains(k.Resources, rel):
			dirs = append(dirs, rel)
			return filepath.SkipDir
		case !d.IsDir() && filepath.Ext(p) == ".yaml" && rel != "kustomization.yaml":
			files = append(files, rel)
		}
		return nil
	}))
	var listed []string
	for _, r := range k.Resources {
		if !slices.Contains(dirs, r) && !strings.HasPrefix(r, "..") {
			listed = append(listed, r)
		}
	}
	assert.ElementsMatch(t, files, listed, "the files of %s", dir)
	for _, d := range dirs {
		assertListsEveryManifest(t, filepath.Join(dir, d))
	}
}

// TestAgentHoldsNoKubernetesCredentials pins the agent's DaemonSet.
func TestAgentHoldsNoKubernetesCredentials(t *testing.T) {
	byKind := objects(t)
	ds := one[appsv1.DaemonSet](t, byKind, "DaemonSet", "virtfleet-agent")
	pod := ds.Spec.Template.Spec
	require.NotNil(t, pod.AutomountServiceAccountToken)
	assert.False(t, *pod.AutomountServiceAccountToken, "agents hold no Kubernetes credentials")
	sa := one[corev1.ServiceAccount](t, byKind, "ServiceAccount", pod.ServiceAccountName)
	require.NotNil(t, sa.AutomountServiceAccountToken)
	assert.False(t, *sa.AutomountServiceAccountToken)
	for _, kind := range []string{"RoleBinding", "ClusterRoleBinding"} {
		for _, o := range byKind[kind] {
			b := &rbacv1.RoleBinding{}
			require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, b))
			for _, s := range b.Subjects {
				assert.NotEqual(t, sa.Name, s.Name, "%s %s binds the agent", kind, b.Name)
			}
		}
	}
	assert.Equal(t, "true", pod.NodeSelector["virtfleet.io/hypervisor"], "agents run on hypervisor nodes only")

	// Nor is a token mounted by hand: no projected service account token, no
	// Secret volume, nothing at the token's well-known path.
	for _, v := range pod.Volumes {
		assert.Nil(t, v.Secret, "volume %s mounts a Secret", v.Name)
		if v.Projected != nil {
			for _, s := range v.Projected.Sources {
				assert.Nil(t, s.ServiceAccountToken, "volume %s projects a service account token", v.Name)
			}
		}
	}
	for _, c := range append(slices.Clone(pod.InitContainers), pod.Containers...) {
		for _, m := range c.VolumeMounts {
			assert.NotContains(t, m.MountPath, "/var/run/secrets/kubernetes.io", "container %s", c.Name)
		}
	}

	hostPaths := map[string]corev1.HostPathVolumeSource{}
	for _, v := range pod.Volumes {
		if v.HostPath != nil {
			hostPaths[v.Name] = *v.HostPath
		}
	}
	require.Len(t, pod.Containers, 1)
	c := pod.Containers[0]
	mounted := map[string]string{}
	for _, m := range c.VolumeMounts {
		mounted[m.Name] = m.MountPath
	}
	sock, ok := hostPaths["libvirt-socket"]
	require.True(t, ok, "the libvirt socket is a hostPath volume")
	assert.Equal(t, "/run/libvirt/libvirt-sock", sock.Path)
	require.NotNil(t, sock.Type)
	assert.Equal(t, corev1.HostPathSocket, *sock.Type)
	assert.Equal(t, sock.Path, mounted["libvirt-socket"])
	assert.ElementsMatch(t, []string{"libvirt-socket", "credentials", "libvirt-consoles"}, keys(hostPaths), "no host path beyond the socket, the node's own seed and the guests' console sockets")
	for _, m := range c.VolumeMounts {
		if m.Name == "libvirt-consoles" {
			assert.True(t, m.ReadOnly, "the agent only connects to the console sockets")
			assert.Equal(t, "/var/lib/libvirt/qemu", m.MountPath, "where --libvirt-console-dir says by default")
		}
	}

	env := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		env[e.Name] = e
	}
	require.Contains(t, env, "VIRTFLEET_NODE")
	require.NotNil(t, env["VIRTFLEET_NODE"].ValueFrom)
	assert.Equal(t, "spec.nodeName", env["VIRTFLEET_NODE"].ValueFrom.FieldRef.FieldPath, "the agent's identity is its node")
	assert.Equal(t, mounted["credentials"], env["VIRTFLEET_NATS_CREDENTIALS"].Value)
	assert.Equal(t, mounted["libvirt-socket"], env["VIRTFLEET_LIBVIRT_SOCKET"].Value)

	sc := c.SecurityContext
	require.NotNil(t, sc)
	assert.Equal(t, []corev1.Capability{"ALL"}, sc.Capabilities.Drop)
	assert.ElementsMatch(t, []corev1.Capability{"DAC_OVERRIDE", "NET_ADMIN"}, sc.Capabilities.Add,
		"only what connecting to the guests' console sockets and making the overlays' devices need")
	assert.False(t, sc.Privileged != nil && *sc.Privileged)
	assert.False(t, *sc.AllowPrivilegeEscalation)
}

// TestAgentRunsOnTheHostsNetwork pins that the agent's overlay devices
// land where libvirtd's bridges are: the host's network namespace, with no
// --netns, while its NATS URL still resolves through the cluster's DNS.
func TestAgentRunsOnTheHostsNetwork(t *testing.T) {
	pod := one[appsv1.DaemonSet](t, objects(t), "DaemonSet", "virtfleet-agent").Spec.Template.Spec
	assert.True(t, pod.HostNetwork, "the VXLAN devices join bridges of the host's namespace")
	assert.Equal(t, corev1.DNSClusterFirstWithHostNet, pod.DNSPolicy, "nats.virtfleet-system.svc resolves from the host's network")
	require.Len(t, pod.Containers, 1)
	for _, e := range pod.Containers[0].Env {
		assert.NotEqual(t, "VIRTFLEET_NETNS", e.Name, "the agent's own namespace is the host's")
	}
}

// TestHub pins the hub's Deployment: probes on the health endpoint,
// leader election with its Lease in its own namespace, non-root.
func TestHub(t *testing.T) {
	byKind := objects(t)
	d := one[appsv1.Deployment](t, byKind, "Deployment", "virtfleet-hub")
	pod := d.Spec.Template.Spec
	require.Len(t, pod.Containers, 1)
	c := pod.Containers[0]
	for name, p := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
		require.NotNil(t, p, "%s probe", name)
		require.NotNil(t, p.HTTPGet, "%s probe", name)
		assert.Equal(t, "health", p.HTTPGet.Port.String(), "%s probe hits the health endpoint", name)
	}
	assert.Equal(t, "/healthz", c.LivenessProbe.HTTPGet.Path)
	assert.Equal(t, "/readyz", c.ReadinessProbe.HTTPGet.Path)
	assert.Contains(t, c.Args, "--leader-election")
	var ns bool
	for _, e := range c.Env {
		ns = ns || (e.Name == "POD_NAMESPACE" && e.ValueFrom != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.namespace")
	}
	assert.True(t, ns, "POD_NAMESPACE tells the hub where its Lease lives")
	require.NotNil(t, pod.SecurityContext.RunAsNonRoot)
	assert.True(t, *pod.SecurityContext.RunAsNonRoot)
	assert.Equal(t, int64(65532), *pod.SecurityContext.RunAsUser, "the image's nonroot user")
	assert.True(t, *c.SecurityContext.ReadOnlyRootFilesystem)
	assert.Equal(t, "virtfleet-hub", pod.ServiceAccountName)
}

// TestGoRuntimeKnowsItsMemoryLimit pins that each Go container has a memory
// limit and hands it to the command (--memory-limit), whose runtime keeps
// under 90% of it (internal/memlimit), so the collector works to stay under
// it rather than the container being killed at it. GOMEMLIMIT set as well
// would override that share.
func TestGoRuntimeKnowsItsMemoryLimit(t *testing.T) {
	byKind := objects(t)
	cases := map[string]corev1.PodSpec{
		"hub":                          one[appsv1.Deployment](t, byKind, "Deployment", "virtfleet-hub").Spec.Template.Spec,
		"agent":                        one[appsv1.DaemonSet](t, byKind, "DaemonSet", "virtfleet-agent").Spec.Template.Spec,
		"hub as Crossplane's provider": providerRuntime(t),
	}
	for name, pod := range cases {
		t.Run(name, func(t *testing.T) {
			require.Len(t, pod.Containers, 1)
			c := pod.Containers[0]
			assert.False(t, c.Resources.Limits.Memory().IsZero(), "a memory limit")
			assert.False(t, slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "GOMEMLIMIT" }), "no GOMEMLIMIT")
			i := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == flagenv.Name(memlimit.FlagName) })
			require.GreaterOrEqual(t, i, 0, "the limit is handed to the command")
			from := c.Env[i].ValueFrom
			require.NotNil(t, from, "the limit comes from the container's spec")
			require.NotNil(t, from.ResourceFieldRef, "the limit comes from the container's spec")
			assert.Equal(t, "limits.memory", from.ResourceFieldRef.Resource)
			assert.Contains(t, []string{"", c.Name}, from.ResourceFieldRef.ContainerName, "its own container's limit")
		})
	}
}

// TestAgentCanWriteWhereItWrites pins that the agent, whose root filesystem
// is read-only, has a volume for each place it writes: the temporary
// directory where each new guest's seed ISO is staged (without it every
// define fails with "read-only file system"), in memory since it is small and
// short-lived, and the image download directory, on disk since an image may
// be larger than the container's memory limit.
func TestAgentCanWriteWhereItWrites(t *testing.T) {
	pod := one[appsv1.DaemonSet](t, objects(t), "DaemonSet", "virtfleet-agent").Spec.Template.Spec
	require.Len(t, pod.Containers, 1)
	c := pod.Containers[0]
	require.NotNil(t, c.SecurityContext)
	require.NotNil(t, c.SecurityContext.ReadOnlyRootFilesystem)
	require.True(t, *c.SecurityContext.ReadOnlyRootFilesystem, "the premise of this test")

	volumeAt := func(dir string) *corev1.Volume {
		for _, m := range c.VolumeMounts {
			if m.ReadOnly || (dir != m.MountPath && !strings.HasPrefix(dir, m.MountPath+"/")) {
				continue
			}
			i := slices.IndexFunc(pod.Volumes, func(v corev1.Volume) bool { return v.Name == m.Name })
			require.GreaterOrEqual(t, i, 0, "volume %s of mount %s", m.Name, m.MountPath)
			return &pod.Volumes[i]
		}
		return nil
	}
	env := func(name string) string {
		i := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == name })
		if i < 0 {
			return ""
		}
		return c.Env[i].Value
	}

	tmp := volumeAt(cmp.Or(env("TMPDIR"), "/tmp"))
	require.NotNil(t, tmp, "a writable volume at the temporary directory")
	require.NotNil(t, tmp.EmptyDir, "the temporary directory is the pod's own")
	assert.Equal(t, corev1.StorageMediumMemory, tmp.EmptyDir.Medium)
	require.NotNil(t, tmp.EmptyDir.SizeLimit, "memory-backed, so bounded")

	dir := env("VIRTFLEET_IMAGE_DIR")
	require.NotEmpty(t, dir, "downloads go to a directory of their own, not the temporary one")
	downloads := volumeAt(dir)
	require.NotNil(t, downloads, "a writable volume at %s", dir)
	assert.False(t, downloads.EmptyDir != nil && downloads.EmptyDir.Medium == corev1.StorageMediumMemory, "downloads are on disk")
}

// TestAgentIsScraped pins that Prometheus finds each node's agent: the pod
// asks to be scraped, at the port named metrics, which is the port the
// agent is told to serve on.
func TestAgentIsScraped(t *testing.T) {
	tmpl := one[appsv1.DaemonSet](t, objects(t), "DaemonSet", "virtfleet-agent").Spec.Template
	require.Len(t, tmpl.Spec.Containers, 1)
	c := tmpl.Spec.Containers[0]
	i := slices.IndexFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == "metrics" })
	require.GreaterOrEqual(t, i, 0, "a container port named metrics")
	port := strconv.Itoa(int(c.Ports[i].ContainerPort))

	assert.Equal(t, "true", tmpl.Annotations["prometheus.io/scrape"])
	assert.Equal(t, port, tmpl.Annotations["prometheus.io/port"], "the annotation names the metrics port")
	assert.Equal(t, "/metrics", tmpl.Annotations["prometheus.io/path"])
	j := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "VIRTFLEET_METRICS_BIND_ADDRESS" })
	require.GreaterOrEqual(t, j, 0, "the agent is told where to serve its metrics")
	_, bound, err := net.SplitHostPort(c.Env[j].Value)
	require.NoError(t, err)
	assert.Equal(t, port, bound, "the agent serves on the metrics port")
}

// providerRuntime is the pod template package/install.yaml gives the
// provider's Deployment through the DeploymentRuntimeConfig its Provider
// names; Crossplane merges it into the Deployment it renders, whose one
// container is package-runtime.
func providerRuntime(t *testing.T) corev1.PodSpec {
	t.Helper()
	objs, err := manifests.Load(filepath.Join("..", "..", "package", "install.yaml"))
	require.NoError(t, err)
	byKind := map[string][]*unstructured.Unstructured{}
	for _, o := range objs {
		byKind[o.GetKind()] = append(byKind[o.GetKind()], o)
	}
	require.Len(t, byKind["Provider"], 1)
	ref, _, err := unstructured.NestedString(byKind["Provider"][0].Object, "spec", "runtimeConfigRef", "name")
	require.NoError(t, err)
	require.NotEmpty(t, ref, "the Provider names its runtime config")
	var drc struct {
		Spec struct {
			DeploymentTemplate struct {
				Spec appsv1.DeploymentSpec `json:"spec"`
			} `json:"deploymentTemplate"`
		} `json:"spec"`
	}
	for _, o := range byKind["DeploymentRuntimeConfig"] {
		if o.GetName() == ref {
			require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &drc))
		}
	}
	pod := drc.Spec.DeploymentTemplate.Spec.Template.Spec
	require.Len(t, pod.Containers, 1, "DeploymentRuntimeConfig %s", ref)
	require.Equal(t, "package-runtime", pod.Containers[0].Name, "the container Crossplane runs the package in")
	return pod
}

// TestHubRBAC pins least privilege: no wildcard anywhere, the grants the
// hub's code needs, and none of the writes it must not have.
func TestHubRBAC(t *testing.T) {
	byKind := objects(t)
	cr := one[rbacv1.ClusterRole](t, byKind, "ClusterRole", "virtfleet-hub")
	api := one[rbacv1.ClusterRole](t, byKind, "ClusterRole", "virtfleet-hub-api")
	role := one[rbacv1.Role](t, byKind, "Role", "virtfleet-hub-leader-election")
	for _, r := range slices.Concat(cr.Rules, api.Rules, role.Rules) {
		for _, list := range [][]string{r.Verbs, r.Resources, r.APIGroups} {
			assert.NotContains(t, list, "*", "wildcard in %+v", r)
		}
		assert.NotContains(t, r.Verbs, "escalate")
		assert.NotContains(t, r.Verbs, "bind")
		assert.NotContains(t, r.Verbs, "impersonate")
	}
	// Every rule the aggregated API needs on a shared kind names the one
	// object it is for.
	for _, r := range slices.Concat(cr.Rules, api.Rules) {
		if slices.Contains(r.Resources, "apiservices") || slices.Contains(r.Resources, "configmaps") {
			assert.Len(t, r.ResourceNames, 1, "%+v names its one object", r)
		}
	}
	type grant struct{ group, resource, verb string }
	cases := map[string]struct {
		rules []rbacv1.PolicyRule
		grant grant
		want  bool
	}{
		"ReadsVirtualMachines":        {cr.Rules, grant{"compute.virtfleet.io", "virtualmachines", "watch"}, true},
		"AddsFinalizers":              {cr.Rules, grant{"compute.virtfleet.io", "virtualmachines", "update"}, true},
		"WritesStatus":                {cr.Rules, grant{"compute.virtfleet.io", "virtualmachines/status", "update"}, true},
		"ReconcilesDiskImages":        {cr.Rules, grant{"compute.virtfleet.io", "diskimages/status", "patch"}, true},
		"MakesAClonesVM":              {cr.Rules, grant{"compute.virtfleet.io", "virtualmachines", "create"}, true},
		"MakesAClonesDisks":           {cr.Rules, grant{"compute.virtfleet.io", "diskimages", "create"}, true},
		"NeverCreatesNetworks":        {cr.Rules, grant{"compute.virtfleet.io", "virtualnetworks", "create"}, false},
		"FollowsClones":               {cr.Rules, grant{"compute.virtfleet.io", "virtualmachineclones", "watch"}, true},
		"WritesCloneStatus":           {cr.Rules, grant{"compute.virtfleet.io", "virtualmachineclones/status", "update"}, true},
		"NeverDeletesClones":          {cr.Rules, grant{"compute.virtfleet.io", "virtualmachineclones", "delete"}, false},
		"NeverDeletesUserResources":   {cr.Rules, grant{"compute.virtfleet.io", "volumes", "delete"}, false},
		"FollowsSnapshots":            {cr.Rules, grant{"compute.virtfleet.io", "virtualmachinesnapshots", "update"}, true},
		"DeletesSnapshotsWithTheirVM": {cr.Rules, grant{"compute.virtfleet.io", "virtualmachinesnapshots", "delete"}, true},
		"NeverCreatesSnapshots":       {cr.Rules, grant{"compute.virtfleet.io", "virtualmachinesnapshots", "create"}, false},
		"WritesRestoreStatus":         {cr.Rules, grant{"compute.virtfleet.io", "virtualmachinerestores/status", "update"}, true},
		"NeverDeletesRestores":        {cr.Rules, grant{"compute.virtfleet.io", "virtualmachinerestores", "delete"}, false},
		"HoldsBackups":                {cr.Rules, grant{"compute.virtfleet.io", "virtualmachinebackups", "update"}, true},
		"WritesBackupStatus":          {cr.Rules, grant{"compute.virtfleet.io", "virtualmachinebackups/status", "update"}, true},
		"ReadsBackupLocations":        {cr.Rules, grant{"compute.virtfleet.io", "backuplocations", "watch"}, true},
		"HoldsRemovedNodes":           {cr.Rules, grant{"compute.virtfleet.io", "hypervisornodes", "update"}, true},
		"NeverDeletesNodes":           {cr.Rules, grant{"compute.virtfleet.io", "hypervisornodes", "delete"}, false},
		"ReadsPlacementGroups":        {cr.Rules, grant{"compute.virtfleet.io", "placementgroups", "watch"}, true},
		"NeverWritesPlacementGroups":  {cr.Rules, grant{"compute.virtfleet.io", "placementgroups", "update"}, false},
		"WritesPlacementGroupStatus":  {cr.Rules, grant{"compute.virtfleet.io", "placementgroups/status", "update"}, true},
		"ReadsInstancetypes":          {cr.Rules, grant{"compute.virtfleet.io", "virtualmachineclusterinstancetypes", "watch"}, true},
		"ReadsPreferences":            {cr.Rules, grant{"compute.virtfleet.io", "virtualmachinepreferences", "watch"}, true},
		"NeverWritesInstancetypes":    {cr.Rules, grant{"compute.virtfleet.io", "virtualmachineinstancetypes", "update"}, false},
		"MakesScheduledBackups":       {cr.Rules, grant{"compute.virtfleet.io", "virtualmachinebackups", "create"}, true},
		"PrunesScheduledBackups":      {cr.Rules, grant{"compute.virtfleet.io", "virtualmachinebackups", "delete"}, true},
		"FollowsBackupSchedules":      {cr.Rules, grant{"compute.virtfleet.io", "virtualmachinebackupschedules", "watch"}, true},
		"WritesBackupScheduleStatus":  {cr.Rules, grant{"compute.virtfleet.io", "virtualmachinebackupschedules/status", "update"}, true},
		"NeverCreatesSchedules":       {cr.Rules, grant{"compute.virtfleet.io", "virtualmachinebackupschedules", "create"}, false},
		"NeverDeletesSchedules":       {cr.Rules, grant{"compute.virtfleet.io", "virtualmachinebackupschedules", "delete"}, false},
		"WritesBackupLocationStatus":  {cr.Rules, grant{"compute.virtfleet.io", "backuplocations/status", "update"}, true},
		"NeverWritesBackupLocations":  {cr.Rules, grant{"compute.virtfleet.io", "backuplocations", "create"}, false},
		"WritesVerificationStatus":    {cr.Rules, grant{"compute.virtfleet.io", "virtualmachinebackupverifications/status", "update"}, true},
		"NeverHoldsVerifications":     {cr.Rules, grant{"compute.virtfleet.io", "virtualmachinebackupverifications", "update"}, false},
		"HoldsProviderConfigsInUse":   {cr.Rules, grant{"virtfleet.io", "providerconfigs", "update"}, true},
		"ReadsClusterProviderConfigs": {cr.Rules, grant{"virtfleet.io", "clusterproviderconfigs", "watch"}, true},
		"ReadsTenantQuotas":           {cr.Rules, grant{"virtfleet.io", "tenantquotas", "watch"}, true},
		"WritesTenantQuotaStatus":     {cr.Rules, grant{"virtfleet.io", "tenantquotas/status", "update"}, true},
		"NeverSetsTenantQuotas":       {cr.Rules, grant{"virtfleet.io", "tenantquotas", "update"}, false},
		"ReadsCredentials":            {cr.Rules, grant{"", "secrets", "get"}, true},
		"NeverWritesSecrets":          {cr.Rules, grant{"", "secrets", "update"}, false},
		"NeverListsSecrets":           {cr.Rules, grant{"", "secrets", "list"}, false},
		"NeverWatchesSecrets":         {cr.Rules, grant{"", "secrets", "watch"}, false},
		"RecordsEvents":               {cr.Rules, grant{"", "events", "create"}, true},
		"WatchesCRDsForSafeStart":     {cr.Rules, grant{"apiextensions.k8s.io", "customresourcedefinitions", "watch"}, true},
		"NeverWritesCRDs":             {cr.Rules, grant{"apiextensions.k8s.io", "customresourcedefinitions", "update"}, false},
		"ElectsALeaderInItsNamespace": {role.Rules, grant{"coordination.k8s.io", "leases", "update"}, true},
		"HoldsNoClusterWideLeases":    {cr.Rules, grant{"coordination.k8s.io", "leases", "update"}, false},
		"NeverTouchesPods":            {cr.Rules, grant{"", "pods", "get"}, false},
		"NeverTouchesRBAC":            {cr.Rules, grant{"rbac.authorization.k8s.io", "clusterroles", "get"}, false},
		"KeepsItsAPIServicesCABundle": {api.Rules, grant{"apiregistration.k8s.io", "apiservices", "update"}, true},
		"NeverCreatesAPIServices":     {slices.Concat(cr.Rules, api.Rules), grant{"apiregistration.k8s.io", "apiservices", "create"}, false},
		"ReadsTheFrontProxysCA":       {api.Rules, grant{"", "configmaps", "get"}, true},
		"NeverListsConfigMaps":        {slices.Concat(cr.Rules, api.Rules), grant{"", "configmaps", "list"}, false},
		"MakesItsCertificateAtHome":   {role.Rules, grant{"", "secrets", "create"}, true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			assert.Equal(t, tc.want, allows(tc.rules, tc.grant.group, tc.grant.resource, tc.grant.verb))
		})
	}
}

// TestThePackageGrantsTheHubOnlyItsOwnRole pins what package/api adds to
// Crossplane's grants for the hub it runs: each rule of
// virtfleet-hub-package is one the hub's own ClusterRole lists (where the
// code needing it is named), bound to the ServiceAccount the provider's
// pods run as. test/deploy's TestProviderPackageOnKubelet checks, against
// Crossplane's RBAC manager, that together they grant the whole role.
func TestThePackageGrantsTheHubOnlyItsOwnRole(t *testing.T) {
	hub := one[rbacv1.ClusterRole](t, objects(t), "ClusterRole", "virtfleet-hub")
	assets, err := envtestassets.Ensure(context.Background(), io.Discard)
	require.NoError(t, err)
	pkgAPI := kustomize(t, filepath.Join(assets, "kubectl"), filepath.Join("..", "..", "package", "api"))
	extra := rendered[rbacv1.ClusterRole](t, pkgAPI, "ClusterRole", "virtfleet-hub-package")
	require.NotEmpty(t, extra.Rules)
	for _, r := range extra.Rules {
		assert.Empty(t, r.ResourceNames, "%+v", r)
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				for _, v := range r.Verbs {
					assert.True(t, allows(hub.Rules, g, res, v), "package/api grants %s on %s.%s, which virtfleet-hub does not", v, res, g)
				}
			}
		}
	}
	crb := rendered[rbacv1.ClusterRoleBinding](t, pkgAPI, "ClusterRoleBinding", "virtfleet-hub-package")
	assert.Equal(t, rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: extra.Name}, crb.RoleRef)
	drc := providerRuntimeConfig(t)
	require.NotNil(t, drc.Spec.ServiceAccountTemplate)
	require.NotNil(t, drc.Spec.ServiceAccountTemplate.Metadata)
	sa := ptr.Deref(drc.Spec.ServiceAccountTemplate.Metadata.Name, "")
	assert.Equal(t, []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa, Namespace: "crossplane-system"}}, crb.Subjects)
}

func allows(rules []rbacv1.PolicyRule, group, resource, verb string) bool {
	for _, r := range rules {
		if slices.Contains(r.APIGroups, group) && slices.Contains(r.Resources, resource) && slices.Contains(r.Verbs, verb) {
			return true
		}
	}
	return false
}

// TestNATSRunsJetStream pins that NATS keeps its streams on a volume and
// loads the per-identity users.
func TestNATSRunsJetStream(t *testing.T) {
	byKind := objects(t)
	ss := one[appsv1.StatefulSet](t, byKind, "StatefulSet", "nats")
	cm := one[corev1.ConfigMap](t, byKind, "ConfigMap", "nats-config")
	conf := cm.Data["nats.conf"]
	assert.Contains(t, conf, "jetstream")
	assert.Contains(t, conf, "store_dir: /data/jetstream")
	assert.Contains(t, conf, "include ./auth/auth.conf", "the nkey users, one per agent")
	require.Len(t, ss.Spec.VolumeClaimTemplates, 1)
	assert.Equal(t, "data", ss.Spec.VolumeClaimTemplates[0].Name)
	svc := one[corev1.Service](t, byKind, "Service", "nats")
	assert.Equal(t, int32(4222), svc.Spec.Ports[0].Port, "the agents' VIRTFLEET_NATS_URL port")
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
