package e2e

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	apisv1alpha1 "github.com/virtfleet/virtfleet/apis/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/harness/natstest"
	"github.com/virtfleet/virtfleet/internal/harness/stack"
)

// TestHostileTenant acts as a tenant, a user with nothing but a Role on
// virtfleet's resources in its own namespace, which the administrator
// granted nothing (stack.DefaultGrants names only default and guests),
// against a libvirt node that also runs a guest and has a volume, a
// network and an image server of the host's own. Each attempt to reach
// them is refused in the tenant's status and events, reveals nothing of
// them, and leaves them as they were, also once the tenant deletes what
// it made. The same imports succeed in a granted namespace
// (TestImportVolumeAndNetwork, TestOrphanAdoptImport).
func TestHostileTenant(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the whole stack; skipped with -short")
	}
	t.Parallel()
	const (
		node   = "host"
		tenant = "tenant-a"
		vault  = "vault.qcow2"
	)
	h := startStack(t, "vf-tenant-", stack.Options{Nodes: []string{node}})
	ctx := context.Background()
	require.NoError(t, h.kube.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: tenant}}))
	guest := libvirtForeign(t, h, node, "default")
	h.libvirtVolume(t, node, vault, 1<<30)
	var fetched atomic.Int32
	secret := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fetched.Add(1)
		_, _ = w.Write(make([]byte, 1<<20))
	}))
	t.Cleanup(secret.Close)
	// The tenant is a user that may do what it likes with virtfleet's
	// resources in its namespace and its ProviderConfigs there, and
	// nothing else: no ClusterProviderConfig, so no grant of its own.
	require.NoError(t, h.kube.Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Namespace: tenant, Name: "virtfleet-tenant"},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{v1alpha1.Group}, Resources: []string{"*"}, Verbs: []string{"*"}},
			{APIGroups: []string{apisv1alpha1.Group}, Resources: []string{"providerconfigs"}, Verbs: []string{"*"}},
		},
	}))
	require.NoError(t, h.kube.Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: tenant, Name: "virtfleet-tenant"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "virtfleet-tenant"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: "tenant-a-user"}},
	}))
	require.NoError(t, h.s.ControlPlane.AwaitAllowed(ctx, "tenant-a-user",
		authorizationv1.ResourceAttributes{Namespace: tenant, Verb: "create", Group: v1alpha1.Group, Resource: "virtualmachines"},
		authorizationv1.ResourceAttributes{Namespace: tenant, Verb: "create", Group: apisv1alpha1.Group, Resource: "providerconfigs"}))
	as, err := h.s.ControlPlane.UserClient("tenant-a-user")
	require.NoError(t, err)
	create := func(o client.Object) { t.Helper(); require.NoError(t, as.Create(ctx, o)) }
	deleteAndWait := func(t *testing.T, o client.Object) {
		t.Helper()
		require.NoError(t, as.Delete(ctx, o))
		require.Eventually(t, func() bool { return kerrors.IsNotFound(as.Get(ctx, client.ObjectKeyFromObject(o), o)) },
			30*time.Second, 100*time.Millisecond, "%T %s was not finalized", o, o.GetName())
	}

	t.Run("TheTenantCannotGrantItselfAnything", func(t *testing.T) {
		err := as.Create(ctx, &apisv1alpha1.ClusterProviderConfig{
			ObjectMeta: metav1.ObjectMeta{Name: "mine"},
			Spec: apisv1alpha1.ClusterProviderConfigSpec{
				ProviderConfigSpec: apisv1alpha1.ProviderConfigSpec{NATSURL: h.s.NATSURL(), Credentials: apisv1alpha1.NATSCredentials{Source: xpv2.CredentialsSourceNone}},
				Grants:             []apisv1alpha1.TenantGrant{{Namespaces: []string{tenant}, Import: true, ChooseNode: true}},
			},
		})
		assert.True(t, kerrors.IsForbidden(err), "a tenant writes no cluster-scoped grant: %v", err)
	})

	ownVolume := func(name string) *v1alpha1.Volume {
		v := volume(name)
		v.Namespace = tenant
		create(v)
		return v
	}
	vmOn := func(name, disk string, change func(*v1alpha1.VirtualMachine)) *v1alpha1.VirtualMachine {
		vm := &v1alpha1.VirtualMachine{
			ObjectMeta: metav1.ObjectMeta{Namespace: tenant, Name: name},
			Spec: v1alpha1.VirtualMachineSpec{ForProvider: v1alpha1.VirtualMachineParameters{
				Vcpu:            1,
				Memory:          resource.MustParse("128Mi"),
				DiskAttachments: []v1alpha1.DiskAttachment{{Name: v1alpha1.LocalName(disk)}},
			}},
		}
		change(vm)
		create(vm)
		return vm
	}
	refusedFor := func(t *testing.T, o client.Object, conditions func() xpv2.Condition, want string) {
		t.Helper()
		require.Eventually(t, func() bool {
			return as.Get(ctx, client.ObjectKeyFromObject(o), o) == nil && strings.Contains(conditions().Message, want)
		}, 60*time.Second, 100*time.Millisecond, "%T %s is refused saying %q", o, o.GetName(), want)
		assert.True(t, strings.HasPrefix(conditions().Message, "refused:") || strings.Contains(conditions().Message, ": refused:"), "the message says it was refused: %s", conditions().Message)
		warned := func(e corev1.Event) bool {
			return e.Type == corev1.EventTypeWarning && strings.Contains(e.Message, want)
		}
		assert.Eventually(t, func() bool { return h.hasEventIn(t, tenant, o.GetName(), warned) }, 10*time.Second, 50*time.Millisecond,
			"a Warning event on %s saying %q", o.GetName(), want)
	}

	t.Run("ImportingAHostGuestIsRefusedAndDeletingTheVMLeavesIt", func(t *testing.T) {
		ownVolume("thief-root")
		vm := vmOn("thief", "thief-root", func(vm *v1alpha1.VirtualMachine) {
			meta.SetExternalName(vm, guest)
			meta.AddAnnotations(vm, map[string]string{v1alpha1.AnnotationNode: node})
		})
		refusedFor(t, vm, func() xpv2.Condition { return vm.GetCondition(xpv2.TypeSynced) }, `imports "`+guest+`" by crossplane.io/external-name`)
		assert.Equal(t, v1alpha1.PhaseFailed, vm.Status.AtProvider.Phase)
		assert.Empty(t, vm.Status.AtProvider.ID, "nothing of the guest is shown")
		deleteAndWait(t, vm)
		running, _ := libvirtInspect(t, h, node, guest)
		assert.True(t, running, "the host's guest still runs")
	})

	t.Run("NamingANodeIsRefusedWhateverItOffers", func(t *testing.T) {
		ownVolume("big-root")
		vm := vmOn("big", "big-root", func(vm *v1alpha1.VirtualMachine) {
			vm.Spec.ForProvider.Memory = resource.MustParse("900Gi")
			meta.AddAnnotations(vm, map[string]string{v1alpha1.AnnotationNode: node})
		})
		refusedFor(t, vm, func() xpv2.Condition { return vm.GetCondition(xpv2.TypeSynced) }, `names node "`+node+`" in the annotation`)
		assert.Zero(t, h.domains(t, node)[string(vm.UID)], "no guest of the VM on the node")
		deleteAndWait(t, vm)
	})

	t.Run("ImportingAHostVolumeIsRefusedAndDeletingItLeavesIt", func(t *testing.T) {
		v := volume("vault")
		v.Namespace = tenant
		meta.SetExternalName(v, vault)
		meta.AddAnnotations(v, map[string]string{v1alpha1.AnnotationNode: node})
		create(v)
		require.Eventually(t, func() bool {
			return as.Get(ctx, client.ObjectKeyFromObject(v), v) == nil && v.Status.AtProvider.Phase == v1alpha1.PhaseFailed
		}, 30*time.Second, 100*time.Millisecond, "the Volume is refused")
		assert.Contains(t, v.GetCondition(xpv2.TypeReady).Message, `refused: the Volume imports "`+vault+`"`)
		assert.Nil(t, v.Status.AtProvider.Capacity, "nothing of the volume is shown")
		assert.Empty(t, v.Status.AtProvider.ID, "nothing of the volume is shown")
		deleteAndWait(t, v)
		assert.True(t, h.nodeVolumeExists(t, node, vault), "the host's volume stays")
	})

	t.Run("JoiningAHostBridgeIsRefused", func(t *testing.T) {
		create(&v1alpha1.VirtualNetwork{
			ObjectMeta: metav1.ObjectMeta{Namespace: tenant, Name: "mgmt"},
			Spec: v1alpha1.VirtualNetworkSpec{ForProvider: v1alpha1.VirtualNetworkParameters{
				Mode: v1alpha1.NetworkModeBridge, Bridge: "br-mgmt",
			}},
		})
		ownVolume("bridged-root")
		vm := vmOn("bridged", "bridged-root", func(vm *v1alpha1.VirtualMachine) {
			vm.Spec.ForProvider.VirtualNetworks = []v1alpha1.LocalName{"mgmt"}
		})
		refusedFor(t, vm, func() xpv2.Condition { return vm.GetCondition(xpv2.TypeReady) }, `joins host bridge "br-mgmt"`)
		assert.Empty(t, vm.GetAnnotations()[v1alpha1.AnnotationNode], "placed nowhere")
		mgmt := &v1alpha1.VirtualNetwork{ObjectMeta: metav1.ObjectMeta{Namespace: tenant, Name: "mgmt"}}
		require.Eventually(t, func() bool {
			return as.Get(ctx, client.ObjectKeyFromObject(mgmt), mgmt) == nil &&
				strings.Contains(mgmt.GetCondition(xpv2.TypeReady).Message, `refused: the VirtualNetwork joins host bridge "br-mgmt"`)
		}, 30*time.Second, 100*time.Millisecond, "the network itself says why")
		assert.Equal(t, v1alpha1.PhaseFailed, mgmt.Status.AtProvider.Phase)
		assert.NotContains(t, h.nodeNetworks(t, node), tenant+"_mgmt", "no network made for it")
	})

	t.Run("ImportingAHostNetworkIsRefused", func(t *testing.T) {
		lab := &v1alpha1.VirtualNetwork{
			ObjectMeta: metav1.ObjectMeta{Namespace: tenant, Name: "lab"},
			Spec:       v1alpha1.VirtualNetworkSpec{ForProvider: v1alpha1.VirtualNetworkParameters{CIDR: "192.168.122.0/24"}},
		}
		meta.SetExternalName(lab, "default")
		create(lab)
		ownVolume("lab-root")
		vm := vmOn("lab-user", "lab-root", func(vm *v1alpha1.VirtualMachine) {
			vm.Spec.ForProvider.VirtualNetworks = []v1alpha1.LocalName{"lab"}
		})
		refusedFor(t, vm, func() xpv2.Condition { return vm.GetCondition(xpv2.TypeReady) }, `the VirtualNetwork lab imports "default"`)
		assert.Empty(t, vm.GetAnnotations()[v1alpha1.AnnotationNode], "placed nowhere")
	})

	t.Run("AnImageOnTheNodesLoopbackIsNeverFetched", func(t *testing.T) {
		img := &v1alpha1.DiskImage{
			ObjectMeta: metav1.ObjectMeta{Namespace: tenant, Name: "secret"},
			Spec: v1alpha1.DiskImageSpec{ForProvider: v1alpha1.DiskImageParameters{
				Source: v1alpha1.DiskImageSource{URL: secret.URL + "/secret.raw"},
				Format: ptr(v1alpha1.DiskFormatRaw),
			}},
		}
		create(img)
		v := imageVolume("from-secret", "secret")
		v.Namespace = tenant
		create(v)
		vm := vmOn("reader", "from-secret", func(*v1alpha1.VirtualMachine) {})
		require.Eventually(t, func() bool {
			return as.Get(ctx, client.ObjectKeyFromObject(img), img) == nil &&
				img.Status.AtProvider.Phase == v1alpha1.ImagePhaseFailed
		}, 60*time.Second, 100*time.Millisecond, "the DiskImage fails")
		assert.Contains(t, img.Status.AtProvider.Message, "refused")
		assert.Zero(t, fetched.Load(), "the image server on the node's loopback received no request")
		require.NoError(t, as.Get(ctx, client.ObjectKeyFromObject(vm), vm))
		assert.NotEqual(t, v1alpha1.PhaseRunning, vm.Status.AtProvider.Phase)
	})

	t.Run("AProviderConfigCannotBorrowTheHubsSecret", func(t *testing.T) {
		create(&apisv1alpha1.ProviderConfig{
			ObjectMeta: metav1.ObjectMeta{Namespace: tenant, Name: "borrowed"},
			Spec: apisv1alpha1.ProviderConfigSpec{
				NATSURL: h.s.NATSURL(),
				Credentials: apisv1alpha1.NATSCredentials{
					Source: xpv2.CredentialsSourceSecret,
					CommonCredentialSelectors: xpv2.CommonCredentialSelectors{SecretRef: &xpv2.SecretKeySelector{
						SecretReference: xpv2.SecretReference{Namespace: stack.SystemNamespace, Name: stack.HubSecretName},
						Key:             stack.HubSecretKey,
					}},
				},
			},
		})
		ownVolume("borrower-root")
		vm := vmOn("borrower", "borrower-root", func(vm *v1alpha1.VirtualMachine) {
			vm.SetProviderConfigReference(&xpv2.ProviderConfigReference{Kind: apisv1alpha1.ProviderConfigKind, Name: "borrowed"})
		})
		require.Eventually(t, func() bool {
			return as.Get(ctx, client.ObjectKeyFromObject(vm), vm) == nil &&
				strings.Contains(vm.GetCondition(xpv2.TypeReady).Message+vm.GetCondition(xpv2.TypeSynced).Message, "reads Secrets only in its own namespace "+tenant)
		}, 60*time.Second, 100*time.Millisecond, "the VM says why it is refused")
		assert.Empty(t, vm.GetAnnotations()[v1alpha1.AnnotationNode], "placed nowhere")
	})

	t.Run("AProviderConfigNamesOnlyTheServersAnAdministratorAllowed", func(t *testing.T) {
		// The attacker: a ProviderConfig in its namespace naming an
		// address of its choosing (here one that accepts and never
		// answers), and VMs on it. The hub refuses to dial it at all.
		hole, accepted := natstest.BlackHole(t)
		create(&apisv1alpha1.ProviderConfig{
			ObjectMeta: metav1.ObjectMeta{Namespace: tenant, Name: "hole"},
			Spec:       apisv1alpha1.ProviderConfigSpec{NATSURL: "nats://" + hole, Credentials: apisv1alpha1.NATSCredentials{Source: xpv2.CredentialsSourceNone}},
		})
		ownVolume("hole-root")
		vm := vmOn("hole", "hole-root", func(vm *v1alpha1.VirtualMachine) {
			vm.SetProviderConfigReference(&xpv2.ProviderConfigReference{Kind: apisv1alpha1.ProviderConfigKind, Name: "hole"})
		})
		refusedFor(t, vm, func() xpv2.Condition { return vm.GetCondition(xpv2.TypeSynced) }, "(natsServers: ["+hole+"])")
		assert.Zero(t, accepted.Load(), "the hub never dialled the address")

		// An administrator allowed the server, and it went bad: it still
		// stalls no one else. The tenant's VMs say why they wait, while a
		// VM of another namespace is placed and runs as ever.
		cpc := &apisv1alpha1.ClusterProviderConfig{}
		require.NoError(t, h.kube.Get(ctx, types.NamespacedName{Name: "default"}, cpc))
		cpc.Spec.Grants = append(cpc.Spec.Grants, apisv1alpha1.TenantGrant{Namespaces: []string{tenant}, NATSServers: []string{hole}})
		require.NoError(t, h.kube.Update(ctx, cpc))
		for i := range 4 {
			name := fmt.Sprintf("hole-%d", i)
			ownVolume(name + "-root")
			vmOn(name, name+"-root", func(vm *v1alpha1.VirtualMachine) {
				vm.SetProviderConfigReference(&xpv2.ProviderConfigReference{Kind: apisv1alpha1.ProviderConfigKind, Name: "hole"})
			})
		}
		require.Eventually(t, func() bool { return accepted.Load() > 0 }, time.Minute, 100*time.Millisecond, "the hub dials the allowed server")
		start := time.Now()
		h.create(t, volume("bystander-root"))
		bystander := vmWith("bystander", "bystander-root")
		bystander.Spec.ForProvider.VirtualNetworks = nil
		h.create(t, bystander)
		h.wait(t, "bystander", time.Minute, running)
		t.Logf("a VM of another namespace ran %s after it was created, while the tenant's server never answered", time.Since(start).Round(time.Millisecond))
		require.Eventually(t, func() bool {
			return as.Get(ctx, client.ObjectKeyFromObject(vm), vm) == nil && strings.Contains(vm.GetCondition(xpv2.TypeSynced).Message, "NATS at nats://"+hole)
		}, time.Minute, 100*time.Millisecond, "the tenant's VM says which server it waits for")
		assert.Empty(t, vm.GetAnnotations()[v1alpha1.AnnotationNode], "placed nowhere")
	})
}
