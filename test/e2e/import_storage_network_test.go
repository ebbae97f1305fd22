package e2e

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"
	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"libvirt.org/go/libvirtxml"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/harness/libvirttest"
	"github.com/virtfleet/virtfleet/internal/harness/natstest"
	"github.com/virtfleet/virtfleet/internal/harness/stack"
)

// TestImportVolumeAndNetwork imports a libvirt volume made behind
// virtfleet's back into Volumes: observed only, refused to a second Volume,
// taken over and deleted with the full policy; and a Volume of virtfleet's
// own deleted without the Delete policy leaves its volume. On the same node
// (one stack for both, to save its start), a VirtualNetwork imports the
// node's libvirt network "default" by external name: a VM's interface is on
// it, no network is made, and one that says another subnet fails the VM.
func TestImportVolumeAndNetwork(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the whole stack; skipped with -short")
	}
	t.Parallel()
	const (
		node   = "import-volume"
		legacy = "legacy.qcow2"
	)
	h := startStack(t, "vf-import-volume-", stack.Options{Nodes: []string{node}})
	nc, _ := natstest.Connect(t, h.s.NATS, h.s.AgentIdentities[node])
	h.libvirtVolume(t, node, legacy, 3<<30)
	importer := func(name, external string, policies ...xpv2.ManagementAction) *v1alpha1.Volume {
		v := volume(name)
		meta.SetExternalName(v, external)
		meta.AddAnnotations(v, map[string]string{v1alpha1.AnnotationNode: node})
		if len(policies) > 0 {
			v.SetManagementPolicies(policies)
		}
		return v
	}
	realSize := func(v *v1alpha1.Volume) bool {
		c := v.Status.AtProvider.Capacity
		return v.Status.AtProvider.Phase == v1alpha1.PhaseRunning && c != nil && c.Cmp(resource.MustParse("3Gi")) == 0
	}

	var seen *v1alpha1.Volume
	t.Run("ImportByExternalNameShowsTheRealSize", func(t *testing.T) {
		h.create(t, importer("seen", legacy, xpv2.ManagementActionObserve))
		seen = h.waitVolume(t, "seen", 30*time.Second, realSize)
		assert.NotEmpty(t, seen.Status.AtProvider.ID, "the volume's key")
		assert.Equal(t, node, seen.Status.AtProvider.Node)
		assert.Equal(t, "1Gi", seen.Spec.ForProvider.Size.String(), "the spec is not what shows")
	})

	t.Run("ASecondVolumeNamingTheSameVolumeFails", func(t *testing.T) {
		h.create(t, importer("thief", legacy))
		v := h.waitVolume(t, "thief", 30*time.Second, func(v *v1alpha1.Volume) bool { return v.Status.AtProvider.Phase == v1alpha1.PhaseFailed })
		assert.Contains(t, v.GetCondition(xpv2.TypeReady).Message, "already managed by Volume seen")
		h.deleteObject(t, v)
		assert.True(t, h.nodeVolumeExists(t, node, legacy), "deleting the refused Volume, even with Delete, leaves the volume")
	})

	t.Run("DeletingTheObserverLeavesTheVolume", func(t *testing.T) {
		h.deleteObject(t, seen)
		assert.True(t, h.nodeVolumeExists(t, node, legacy))
		key, err := wire.VolumeIntents.Key(node, string(seen.UID))
		require.NoError(t, err)
		require.Eventually(t, func() bool {
			return !kvHas(t, nc, wire.BucketIntents, key) && !kvHas(t, nc, wire.BucketReports, key)
		}, 30*time.Second, 100*time.Millisecond, "the import's intent and report go")
	})

	t.Run("TheFullPolicyDeletesTheImportedVolume", func(t *testing.T) {
		h.create(t, importer("taken", legacy))
		taken := h.waitVolume(t, "taken", 30*time.Second, realSize)
		h.deleteObject(t, taken)
		assert.False(t, h.nodeVolumeExists(t, node, legacy), "deleted with its Volume")
	})

	t.Run("AVolumeOfItsOwnDeletedWithoutDeleteStays", func(t *testing.T) {
		own := volume("own")
		own.SetManagementPolicies(keepPolicies)
		h.create(t, own)
		h.create(t, imageVM("user", "own"))
		h.wait(t, "user", 90*time.Second, running)
		h.delete(t, "user")
		h.deleteObject(t, getInto(t, h, "own", &v1alpha1.Volume{}))
		assert.True(t, h.nodeVolumeExists(t, node, wire.NameOnNode(ns, "own")), "the volume stays")
	})

	t.Run("AVMAttachesAnImportedVolumeAsItIs", func(t *testing.T) {
		h.libvirtVolume(t, node, "legacy-data.img", 2<<30)
		h.create(t, importer("legacy-data", "legacy-data.img"))
		h.waitVolume(t, "legacy-data", 30*time.Second, func(v *v1alpha1.Volume) bool { return v.Status.AtProvider.Phase == v1alpha1.PhaseRunning })
		h.create(t, volume("data-user-root"))
		vm := imageVM("data-user", "data-user-root")
		vm.Spec.ForProvider.DiskAttachments = append(vm.Spec.ForProvider.DiskAttachments, v1alpha1.DiskAttachment{Name: "legacy-data"})
		h.create(t, vm)
		got := h.wait(t, "data-user", 90*time.Second, running)
		assert.Equal(t, []string{wire.NameOnNode(ns, "data-user-root"), "legacy-data.img"}, h.domainVolumes(t, node, got.Status.AtProvider.ID))
	})

	t.Run("AVolumeThatOnlyObservesIsNeverAttached", func(t *testing.T) {
		h.libvirtVolume(t, node, "peek.img", 1<<30)
		h.create(t, importer("peek", "peek.img", xpv2.ManagementActionObserve))
		h.create(t, volume("peeker-root"))
		vm := imageVM("peeker", "peeker-root")
		vm.Spec.ForProvider.DiskAttachments = append(vm.Spec.ForProvider.DiskAttachments, v1alpha1.DiskAttachment{Name: "peek"})
		h.create(t, vm)
		got := h.wait(t, "peeker", 30*time.Second, func(vm *v1alpha1.VirtualMachine) bool {
			return strings.Contains(vm.GetCondition(xpv2.TypeReady).Message, "Volume peek only observes volume peek.img")
		})
		assert.Equal(t, v1alpha1.PhasePending, got.Status.AtProvider.Phase)
		assert.Empty(t, got.GetAnnotations()[v1alpha1.AnnotationNode], "placed nowhere")
	})

	t.Run("AnAttachedImportedVolumeIsDeletedOnlyOnceItsVMIsGone", func(t *testing.T) {
		data := getInto(t, h, "legacy-data", &v1alpha1.Volume{})
		require.NoError(t, h.kube.Delete(context.Background(), data))
		h.waitVolume(t, "legacy-data", 30*time.Second, func(v *v1alpha1.Volume) bool {
			return strings.Contains(v.GetCondition(xpv2.TypeSynced).Message, "Volume legacy-data is used by VirtualMachine data-user")
		})
		assert.True(t, h.nodeVolumeExists(t, node, "legacy-data.img"), "kept while the VM has it")
		h.delete(t, "data-user")
		require.Eventually(t, func() bool { return !h.nodeVolumeExists(t, node, "legacy-data.img") }, 30*time.Second, 100*time.Millisecond,
			"deleted with its Volume (full policy) once no guest has it")
	})

	// libvirt's own network on every test node: nat, 192.168.122.0/24.
	lab := func(name, cidr string) *v1alpha1.VirtualNetwork {
		n := &v1alpha1.VirtualNetwork{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec:       v1alpha1.VirtualNetworkSpec{ForProvider: v1alpha1.VirtualNetworkParameters{Mode: v1alpha1.NetworkModeNAT, CIDR: cidr}},
		}
		meta.SetExternalName(n, "default")
		return n
	}
	onNetwork := func(name, network string) *v1alpha1.VirtualMachine {
		h.create(t, volume(name+"-root"))
		vm := vmWith(name, name+"-root")
		vm.Spec.ForProvider.VirtualNetworks = []v1alpha1.LocalName{v1alpha1.LocalName(network)}
		h.create(t, vm)
		return vm
	}
	networksBefore := h.nodeNetworks(t, node)

	t.Run("AVirtualNetworkImportsTheNodesNetwork", func(t *testing.T) {
		h.create(t, lab("lab", "192.168.122.0/24"))
		onNetwork("on-lab", "lab")
		vm := h.wait(t, "on-lab", 90*time.Second, running)
		require.Len(t, vm.Status.AtProvider.Interfaces, 1)
		assert.Equal(t, "lab", vm.Status.AtProvider.Interfaces[0].Network, "reported under the VirtualNetwork's name")
		assert.Equal(t, []string{"default"}, h.domainNetworks(t, node, vm.Status.AtProvider.ID), "the interface is on the imported network")
		assert.Equal(t, networksBefore, h.nodeNetworks(t, node), "no network made for it")
	})

	t.Run("ANetworkThatIsNotWhatTheVirtualNetworkSaysFailsTheVM", func(t *testing.T) {
		h.create(t, lab("lab-elsewhere", "10.99.0.0/24"))
		onNetwork("on-elsewhere", "lab-elsewhere")
		vm := h.wait(t, "on-elsewhere", 30*time.Second, phase(v1alpha1.PhaseFailed))
		assert.Contains(t, vm.GetCondition(xpv2.TypeReady).Message, `network "default" serves [192.168.122.0/24], the VirtualNetwork that imports it says 10.99.0.0/24`)
	})

	t.Run("DeletingTheVirtualNetworkLeavesTheNetwork", func(t *testing.T) {
		for _, vm := range []string{"on-lab", "on-elsewhere"} {
			h.delete(t, vm)
		}
		for _, n := range []string{"lab", "lab-elsewhere"} {
			h.deleteObject(t, getInto(t, h, n, &v1alpha1.VirtualNetwork{}))
		}
		assert.Equal(t, networksBefore, h.nodeNetworks(t, node))
	})
}

// nodeNetworks are the names of node's libvirt networks, active or not.
func (h *hub) nodeNetworks(t *testing.T, node string) []string {
	t.Helper()
	l, err := h.s.Nodes[node].Dial()
	require.NoError(t, err)
	defer func() { _ = l.Disconnect() }()
	nets, _, err := l.ConnectListAllNetworks(1, 0)
	require.NoError(t, err)
	var names []string
	for _, n := range nets {
		names = append(names, n.Name)
	}
	slices.Sort(names)
	return names
}

// domainVolumes are the pool volumes of node's domain uuid, in order, but
// the guest's seed and swap.
func (h *hub) domainVolumes(t *testing.T, node, id string) []string {
	t.Helper()
	var out []string
	for _, d := range h.domainDefinition(t, node, id).Devices.Disks {
		if d.Source != nil && d.Source.Volume != nil && !strings.HasSuffix(d.Source.Volume.Volume, "-seed.iso") && !strings.HasSuffix(d.Source.Volume.Volume, "-swap.img") {
			out = append(out, d.Source.Volume.Volume)
		}
	}
	return out
}

// domainDefinition is the definition of node's domain uuid.
func (h *hub) domainDefinition(t *testing.T, node, id string) *libvirtxml.Domain {
	t.Helper()
	l, err := h.s.Nodes[node].Dial()
	require.NoError(t, err)
	defer func() { _ = l.Disconnect() }()
	u, err := uuid.Parse(id)
	require.NoError(t, err, "the VM's id is its domain's UUID")
	d, err := l.DomainLookupByUUID(golibvirt.UUID(u))
	require.NoError(t, err)
	x, err := l.DomainGetXMLDesc(d, 0)
	require.NoError(t, err)
	def := &libvirtxml.Domain{}
	require.NoError(t, def.Unmarshal(x))
	return def
}

// domainNetworks are the networks of the interfaces of node's domain uuid.
func (h *hub) domainNetworks(t *testing.T, node, id string) []string {
	t.Helper()
	var out []string
	for _, i := range h.domainDefinition(t, node, id).Devices.Interfaces {
		if i.Source != nil && i.Source.Network != nil {
			out = append(out, i.Source.Network.Network)
		}
	}
	return out
}

// libvirtVolume makes a volume in node's pool with go-libvirt directly, as
// virsh vol-create-as would.
func (h *hub) libvirtVolume(t *testing.T, node, name string, size uint64) {
	t.Helper()
	l, err := h.s.Nodes[node].Dial()
	require.NoError(t, err)
	defer func() { _ = l.Disconnect() }()
	p, err := l.StoragePoolLookupByName(libvirttest.Pool)
	require.NoError(t, err)
	x, err := (&libvirtxml.StorageVolume{Name: name, Capacity: &libvirtxml.StorageVolumeSize{Value: size, Unit: "B"}}).Marshal()
	require.NoError(t, err)
	_, err = l.StorageVolCreateXML(p, x, 0)
	require.NoError(t, err)
}

// waitVolume polls the API until Volume name satisfies ok.
func (h *hub) waitVolume(t *testing.T, name string, timeout time.Duration, ok func(*v1alpha1.Volume) bool) *v1alpha1.Volume {
	t.Helper()
	v := &v1alpha1.Volume{}
	require.Eventually(t, func() bool {
		return h.kube.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, v) == nil && ok(v)
	}, timeout, 100*time.Millisecond, "Volume %s: last status %+v, conditions %+v", name, &v.Status.AtProvider, v.Status.Conditions)
	return v
}

// deleteObject deletes o and waits until the hub finalized it: once the
// backend deleted what it made, which on a real cloud (Nova deleting a
// server through its services) takes tens of seconds on a busy machine.
func (h *hub) deleteObject(t *testing.T, o client.Object) {
	t.Helper()
	require.NoError(t, h.kube.Delete(context.Background(), o))
	require.Eventually(t, func() bool {
		return kerrors.IsNotFound(h.kube.Get(context.Background(), client.ObjectKeyFromObject(o), o))
	}, 2*time.Minute, 100*time.Millisecond, "%T %s was not finalized", o, o.GetName())
}
