package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/harness/stack"
)

// TestSubresources drives a VM through the aggregated API with the kubectl
// plugin, as its users would: the API server authorizes each subresource
// with RBAC and proxies it to the hub, which changes the VM or opens the
// stream from the VM's node.
func TestSubresources(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the whole stack; skipped with -short")
	}
	t.Parallel()
	const other = "tenant-b"
	h := startStack(t, "vf-sub-", stack.Options{Nodes: []string{"node1"}, Subresources: true, ResyncInterval: 2 * time.Second})
	ctx := context.Background()
	plugin := h.s.Plugin()

	require.NoError(t, h.kube.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: other}}))
	for _, n := range []string{ns, other} {
		require.NoError(t, h.kube.Create(ctx, &v1alpha1.Volume{
			ObjectMeta: metav1.ObjectMeta{Namespace: n, Name: "sub-root"},
			Spec:       v1alpha1.VolumeSpec{ForProvider: v1alpha1.VolumeParameters{Size: resource.MustParse("1Gi")}},
		}))
		require.NoError(t, h.kube.Create(ctx, &v1alpha1.VirtualMachine{
			ObjectMeta: metav1.ObjectMeta{Namespace: n, Name: "sub"},
			Spec: v1alpha1.VirtualMachineSpec{ForProvider: v1alpha1.VirtualMachineParameters{
				Vcpu: 1, Memory: resource.MustParse("128Mi"), DiskAttachments: []v1alpha1.DiskAttachment{{Name: "sub-root"}},
			}},
		}))
	}

	// alice may read VMs and use every subresource in ns, through the
	// ClusterRoles cluster/deploy aggregates into edit; bob may only read.
	for user, roles := range map[string][]string{"alice": {"virtfleet-vm-console", "virtfleet-vm-power", "vm-reader"}, "bob": {"vm-reader"}} {
		for _, role := range roles {
			require.NoError(t, h.kube.Create(ctx, &rbacv1.RoleBinding{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: user + "-" + role},
				RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
				Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
			}))
		}
	}
	require.NoError(t, h.kube.Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "vm-reader"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{v1alpha1.Group}, Resources: []string{"virtualmachines"}, Verbs: []string{"get", "list"}}},
	}))
	alice, bob := userPlugin(t, h, plugin, "alice"), userPlugin(t, h, plugin, "bob")

	vm := h.wait(t, "sub", time.Minute, running)
	restarts := vm.Status.AtProvider.RestartCount

	t.Run("PauseHoldsUntilUnpaused", func(t *testing.T) {
		out, err := alice("pause", "sub")
		require.NoError(t, err, out)
		assert.Contains(t, out, "pause requested by alice")
		h.wait(t, "sub", 30*time.Second, phase(v1alpha1.PhasePaused))
		h.assertEvent(t, "sub", "ActionRequested", "pause requested by alice")
		// The agent resyncs every 2 s here: a paused guest it resumed of
		// its own accord would show Running again.
		assert.Never(t, func() bool { return h.get(t, "sub").Status.AtProvider.Phase != v1alpha1.PhasePaused }, 6*time.Second, 200*time.Millisecond)
		out, err = alice("pause", "sub")
		require.Error(t, err)
		assert.Contains(t, out, "is already paused")
		out, err = alice("unpause", "sub")
		require.NoError(t, err, out)
		h.wait(t, "sub", 30*time.Second, running)
	})

	t.Run("RestartAndResetEachCountOnce", func(t *testing.T) {
		for i, action := range []string{"restart", "reset"} {
			out, err := alice(action, "sub")
			require.NoError(t, err, out)
			want := restarts + int32(i) + 1
			h.wait(t, "sub", 30*time.Second, func(vm *v1alpha1.VirtualMachine) bool { return vm.Status.AtProvider.RestartCount == want })
		}
		assert.Never(t, func() bool { return h.get(t, "sub").Status.AtProvider.RestartCount != restarts+2 }, 3*time.Second, 200*time.Millisecond,
			"each request restarts the guest once")
	})

	t.Run("StopAndStart", func(t *testing.T) {
		out, err := alice("stop", "sub")
		require.NoError(t, err, out)
		h.wait(t, "sub", 30*time.Second, phase(v1alpha1.PhaseStopped))
		out, err = alice("pause", "sub")
		require.Error(t, err)
		assert.Contains(t, out, "is not running")
		out, err = alice("start", "sub")
		require.NoError(t, err, out)
		h.wait(t, "sub", 30*time.Second, running)
	})

	t.Run("ConsoleComesFromTheNode", func(t *testing.T) {
		// The test driver has no guest to hold a console: the refusal
		// comes back from the node's agent, through NATS, the hub and the
		// API server. Real consoles: test/guest.
		out, err := alice("console", "sub")
		require.Error(t, err)
		assert.Contains(t, out, "has no console to open")
	})

	t.Run("RefusedWithoutTheVerb", func(t *testing.T) {
		for _, args := range [][]string{{"pause", "sub"}, {"console", "sub"}, {"vnc", "sub"}} {
			out, err := bob(args...)
			require.Error(t, err)
			assert.Contains(t, out, "forbidden", args)
		}
	})

	t.Run("RefusedInAnotherNamespace", func(t *testing.T) {
		for _, args := range [][]string{{"-n", other, "console", "sub"}, {"-n", other, "stop", "sub"}} {
			out, err := alice(args...)
			require.Error(t, err)
			assert.Contains(t, out, "forbidden", args)
		}
		assert.True(t, ptrValue(getIn(t, h, other, "sub").Spec.ForProvider.Running, true), "the other namespace's VM was not stopped")
	})

	t.Run("MigrateCreatesAMigration", func(t *testing.T) {
		out, err := alice("migrate", "sub")
		require.NoError(t, err, out)
		l := &v1alpha1.VirtualMachineMigrationList{}
		require.NoError(t, h.kube.List(ctx, l, client.InNamespace(ns)))
		require.Len(t, l.Items, 1)
		assert.Equal(t, v1alpha1.LocalName("sub"), l.Items[0].Spec.VMName)
		assert.Contains(t, out, "VirtualMachineMigration "+l.Items[0].Name)
	})

	t.Run("CompletesVMNames", func(t *testing.T) {
		out, err := alice("__complete", "console", "s")
		require.NoError(t, err, out)
		assert.Equal(t, "sub", strings.Split(out, "\n")[0], "the namespace's VMs that start so")
	})

	t.Run("NoSuchVM", func(t *testing.T) {
		out, err := alice("restart", "nope")
		require.Error(t, err)
		assert.Contains(t, out, `"nope" not found`)
	})

	t.Run("OnlyTheAPIServerMayCallTheHub", func(t *testing.T) {
		// Straight to the hub's port, with the user header a front proxy
		// would set, but without the front proxy's certificate.
		c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // the attacker does not care who the server is
		req, err := http.NewRequest(http.MethodPut, fmt.Sprintf("https://127.0.0.1:%d/apis/subresources.virtfleet.io/v1alpha1/namespaces/%s/virtualmachines/sub/stop", h.s.SubresourcesPort(), other), nil)
		require.NoError(t, err)
		req.Header.Set("X-Remote-User", "system:admin")
		resp, err := c.Do(req)
		require.NoError(t, err)
		_ = resp.Body.Close()
		assert.Equal(t, http.StatusUnauthorized, resp.StatusCode)
		assert.True(t, ptrValue(getIn(t, h, other, "sub").Spec.ForProvider.Running, true))
	})
}

// userPlugin runs the plugin as user of groups, returning its output and
// error.
func userPlugin(t *testing.T, h *hub, plugin, user string, groups ...string) func(args ...string) (string, error) {
	t.Helper()
	kubeconfig, err := h.s.ControlPlane.AddUser(user, groups...)
	require.NoError(t, err)
	return func(args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, plugin, append([]string{"--kubeconfig", kubeconfig, "-n", ns}, args...)...)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		return strings.TrimSpace(out.String()), err
	}
}

func getIn(t *testing.T, h *hub, namespace, name string) *v1alpha1.VirtualMachine {
	t.Helper()
	vm := &v1alpha1.VirtualMachine{}
	require.NoError(t, h.kube.Get(context.Background(), types.NamespacedName{Namespace: namespace, Name: name}, vm))
	return vm
}

func ptrValue(p *bool, def bool) bool {
	if p == nil {
		return def
	}
	return *p
}

// consolePrompt opens VM name's serial console with the plugin, as the
// cluster's administrator, and returns what it showed once a newline made
// the guest prompt.
func consolePrompt(t *testing.T, h *hub, name string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := h.s.OpenConsole(ctx, ns, name)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		_ = c.Send("\r")
		return strings.Count(c.Output(), " login: ") >= 2
	}, 30*time.Second, 500*time.Millisecond, "the console's prompt, and again after a newline; got %q", c.Output())
	require.NoError(t, c.Leave(30*time.Second), "the plugin leaves when its input ends")
	return c.Output()
}
