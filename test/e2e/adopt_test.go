package e2e

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"libvirt.org/go/libvirtxml"
	"sigs.k8s.io/controller-runtime/pkg/client"

	golibvirt "github.com/digitalocean/go-libvirt"
	"github.com/google/uuid"
	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/blockstorage/v3/volumes"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/flavors"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/servers"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/networks"

	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/agent/driver/kubevirt"
	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/harness/kubevirttest"
	"github.com/virtfleet/virtfleet/internal/harness/natstest"
	"github.com/virtfleet/virtfleet/internal/harness/openstack"
	"github.com/virtfleet/virtfleet/internal/harness/stack"
)

// guestBackend is what the orphan, adopt and import scenarios need of one
// backend, done behind virtfleet's back.
type guestBackend struct {
	// foreign makes a running guest outside virtfleet, with one vCPU, on
	// node's network network, and returns its external name.
	foreign func(t *testing.T, h *hub, node, network string) string
	// inspect reads the guest with external name name: whether it runs
	// and its vCPUs.
	inspect func(t *testing.T, h *hub, node, name string) (running bool, vcpu int)
	// exists says whether the guest with external name name is there.
	exists func(t *testing.T, h *hub, node, name string) bool
}

var guestBackends = map[string]guestBackend{
	driver.BackendLibvirt: {foreign: libvirtForeign, inspect: libvirtInspect, exists: libvirtExists},
	driver.BackendNova:    {foreign: novaForeign, inspect: novaInspect, exists: novaExists},
	// KubeVirt's guests are its VirtualMachines, named by name or uid.
	driver.BackendKubeVirt: {foreign: kubevirtForeign, inspect: kubevirtInspect, exists: kubevirtExists},
}

// TestOrphanAdoptImport runs the orphan, adopt and import scenarios on each
// backend whose driver is a driver.Adopter.
func TestOrphanAdoptImport(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the whole stack; skipped with -short")
	}
	t.Parallel()
	for _, backend := range []string{driver.BackendLibvirt, driver.BackendNova, driver.BackendKubeVirt} {
		t.Run(backend, func(t *testing.T) {
			gb, ok := guestBackends[backend]
			if !ok {
				t.Skipf("the %s driver does not implement driver.Adopter yet: its nodes refuse release markers and claims", backend)
			}
			t.Parallel()
			testOrphanAdoptImport(t, backend, gb)
		})
	}
}

// keepPolicies are the management policies without Delete.
var keepPolicies = xpv2.ManagementPolicies{xpv2.ManagementActionObserve, xpv2.ManagementActionCreate, xpv2.ManagementActionUpdate, xpv2.ManagementActionLateInitialize}

func testOrphanAdoptImport(t *testing.T, backend string, gb guestBackend) {
	// Not TestBackends' node names: nova nodes share one cloud, and a
	// node sees the servers its name is on.
	node := backend + "-adopt"
	o := stack.Options{Nodes: []string{node}}
	if backend != driver.BackendLibvirt {
		o.Backends = map[string]string{node: backend}
	}
	h := startStack(t, "vf-adopt-"+backend+"-", o)
	// Real Nova's first build on a loaded 2-core machine is slow.
	boot := 90 * time.Second
	if backend == driver.BackendNova {
		boot = 4 * time.Minute
	}
	h.create(t, &v1alpha1.VirtualNetwork{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "net-db"},
		Spec:       v1alpha1.VirtualNetworkSpec{ForProvider: v1alpha1.VirtualNetworkParameters{CIDR: "10.10.120.0/24"}},
	})
	on := func(vm *v1alpha1.VirtualMachine) *v1alpha1.VirtualMachine {
		vm.Spec.ForProvider.Backend = ptr(v1alpha1.Backend(backend))
		return vm
	}
	// The node's own identity reads its keys, as its agent would.
	nc, _ := natstest.Connect(t, h.s.NATS, h.s.AgentIdentities[node])
	h.create(t, volume("keep-root"))
	keep := on(vmWith("keep", "keep-root"))
	keep.SetManagementPolicies(keepPolicies)
	h.create(t, keep)
	first := h.wait(t, "keep", boot, running)
	firstUID := string(first.UID)
	guests := h.domains(t, node)

	t.Run("OrphanLeavesTheGuestRunningAndNoIntent", func(t *testing.T) {
		h.delete(t, "keep")
		assertSameGuests(t, guests, h.domains(t, node), "no guest went or came")
		running, vcpu := gb.inspect(t, h, node, first.Status.AtProvider.ID)
		assert.True(t, running, "the orphan keeps running")
		assert.Equal(t, 1, vcpu)
		key, err := wire.GuestIntents.Key(node, firstUID)
		require.NoError(t, err)
		assert.False(t, kvHas(t, nc, wire.BucketIntents, key), "the node holds no intent for it")
		assert.True(t, kvHas(t, nc, wire.BucketReports, key), "the node reports its orphan")
		h.assertEvent(t, "keep", "Orphaned", "orphaned")
	})

	t.Run("HubAndAgentKilledChangeNothing", func(t *testing.T) {
		h.s.KillHub()
		h.s.KillAgent(node)
		require.NoError(t, h.s.StartAgent(node))
		require.NoError(t, h.s.StartHub())
		assertSameGuests(t, guests, h.domains(t, node), "nothing changed")
	})

	t.Run("ReCreateAdoptsTheSameGuest", func(t *testing.T) {
		again := on(vmWith("keep", "keep-root"))
		h.create(t, again)
		vm := h.wait(t, "keep", boot, running)
		assert.NotEqual(t, firstUID, string(vm.UID), "a new VM")
		assert.Equal(t, first.Status.AtProvider.ID, vm.Status.AtProvider.ID, "the same guest")
		assert.Equal(t, first.Status.AtProvider.IP, vm.Status.AtProvider.IP, "the same address")
		assert.Equal(t, first.Status.AtProvider.RestartCount, vm.Status.AtProvider.RestartCount, "the restart count carries on")
		assert.Equal(t, firstUID, vm.GetAnnotations()[v1alpha1.AnnotationAdopted])
		assertSameGuests(t, guests, h.domains(t, node), "exactly one guest")
		key, err := wire.GuestReports.Key(node, firstUID)
		require.NoError(t, err)
		require.Eventually(t, func() bool { return !kvHas(t, nc, wire.BucketReports, key) }, 10*time.Second, 50*time.Millisecond, "the orphan's report goes")
	})

	t.Run("AnAgentRestartKeepsTheAdoptedGuest", func(t *testing.T) {
		h.s.KillAgent(node)
		require.NoError(t, h.s.StartAgent(node))
		vm := h.wait(t, "keep", boot, running)
		assert.Equal(t, first.Status.AtProvider.ID, vm.Status.AtProvider.ID)
		assertSameGuests(t, guests, h.domains(t, node), "nothing changed")
	})

	external := gb.foreign(t, h, node, wire.NameOnNode(ns, "net-db"))
	guests = h.domains(t, node)
	h.create(t, volume("seen-root"))
	observed := on(vmWith("seen", "seen-root"))
	observed.SetManagementPolicies(xpv2.ManagementPolicies{xpv2.ManagementActionObserve})
	meta.SetExternalName(observed, external)
	meta.AddAnnotations(observed, map[string]string{v1alpha1.AnnotationNode: node})

	t.Run("ImportByExternalNameShowsTheRealGuest", func(t *testing.T) {
		h.create(t, observed)
		vm := h.wait(t, "seen", boot, func(vm *v1alpha1.VirtualMachine) bool {
			return running(vm) && len(vm.Status.AtProvider.Interfaces) > 0 && len(vm.Status.AtProvider.Interfaces[0].IPs) > 0
		})
		assert.NotEmpty(t, vm.Status.AtProvider.Node)
		assert.Equal(t, int32(1), vm.Status.AtProvider.Vcpu, "its real vCPUs, not the spec's")
		assert.NotNil(t, vm.Status.AtProvider.Memory)
	})

	t.Run("ObserveOnlyNeverChangesTheGuest", func(t *testing.T) {
		h.patch(t, "seen", func(vm *v1alpha1.VirtualMachine) {
			vm.Spec.ForProvider.Running = ptr(false)
			vm.Spec.ForProvider.Vcpu = 3
		})
		gen := h.get(t, "seen").Generation
		h.wait(t, "seen", 30*time.Second, func(vm *v1alpha1.VirtualMachine) bool {
			return vm.Status.AtProvider.ObservedGeneration == gen
		})
		running, vcpu := gb.inspect(t, h, node, external)
		assert.True(t, running, "not stopped")
		assert.Equal(t, 1, vcpu, "not redefined")
		assert.Equal(t, v1alpha1.PhaseRunning, h.get(t, "seen").Status.AtProvider.Phase)
	})

	t.Run("ASecondVMNamingAnOwnedGuestFails", func(t *testing.T) {
		h.create(t, volume("thief-root"))
		thief := on(vmWith("thief", "thief-root"))
		meta.SetExternalName(thief, first.Status.AtProvider.ID)
		meta.AddAnnotations(thief, map[string]string{v1alpha1.AnnotationNode: node})
		h.create(t, thief)
		vm := h.wait(t, "thief", boot, phase(v1alpha1.PhaseFailed))
		assert.Contains(t, vm.GetCondition(xpv2.TypeReady).Message, "VirtualMachine "+ns+"/keep")
		assertSameGuests(t, guests, h.domains(t, node), "nothing made, nothing taken")
		h.delete(t, "thief")
		h.wait(t, "keep", 10*time.Second, running)
	})

	t.Run("DeletingTheObserverLeavesTheGuest", func(t *testing.T) {
		h.delete(t, "seen")
		running, _ := gb.inspect(t, h, node, external)
		assert.True(t, running)
	})

	t.Run("ATenantWithoutTheGrantCannotImportIt", func(t *testing.T) {
		const tenant = "tenant-a"
		require.NoError(t, h.kube.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: tenant}}))
		root := volume("intruder-root")
		root.Namespace = tenant
		h.create(t, root)
		intruder := on(vmWith("intruder", "intruder-root"))
		intruder.Namespace = tenant
		meta.SetExternalName(intruder, external)
		meta.AddAnnotations(intruder, map[string]string{v1alpha1.AnnotationNode: node})
		h.create(t, intruder)
		require.Eventually(t, func() bool {
			return h.kube.Get(context.Background(), client.ObjectKeyFromObject(intruder), intruder) == nil &&
				strings.Contains(intruder.GetCondition(xpv2.TypeSynced).Message, "refused: the VirtualMachine imports")
		}, 30*time.Second, 100*time.Millisecond, "the VM says it was refused")
		assert.Empty(t, intruder.Status.AtProvider.ID, "nothing of the guest is shown")
		assert.Nil(t, intruder.Status.AtProvider.Memory, "nothing of the guest is shown")
		h.deleteObject(t, intruder)
		running, _ := gb.inspect(t, h, node, external)
		assert.True(t, running, "the guest survives the refused VM's deletion")
		assertSameGuests(t, guests, h.domains(t, node), "nothing made, nothing taken")
	})

	t.Run("TheFullPolicyTakesAnImportedGuestOver", func(t *testing.T) {
		taken := on(vmWith("taken", "seen-root"))
		meta.SetExternalName(taken, external)
		meta.AddAnnotations(taken, map[string]string{v1alpha1.AnnotationNode: node})
		h.create(t, taken)
		h.wait(t, "taken", boot, running)
		h.patch(t, "taken", func(vm *v1alpha1.VirtualMachine) { vm.Spec.ForProvider.Running = ptr(false) })
		h.wait(t, "taken", boot, phase(v1alpha1.PhaseStopped))
		running, _ := gb.inspect(t, h, node, external)
		assert.False(t, running, "the hub stopped it")
	})

	// Nova's nodes share one cloud with the other tests, whose checks that
	// a flavor goes with its last user would count the adopted guests.
	t.Run("WithTheDeletePolicyTheAdoptedGuestIsDeleted", func(t *testing.T) {
		h.patch(t, "keep", func(vm *v1alpha1.VirtualMachine) {
			vm.SetManagementPolicies(xpv2.ManagementPolicies{xpv2.ManagementActionAll})
		})
		adopter := string(h.get(t, "keep").UID)
		h.delete(t, "keep")
		h.delete(t, "taken")
		left := h.domains(t, node)
		// A backend counts the guest by the uid of the VM that made it
		// (libvirt) or of the VM managing it (nova).
		assert.Zero(t, left[firstUID], "the adopted guest is deleted: %v", left)
		assert.Zero(t, left[adopter], "the adopted guest is deleted: %v", left)
		// Polled on the test's goroutine: exists reads the backend with
		// require, which must not run on Eventually's.
		err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
			return !gb.exists(t, h, node, external), nil
		})
		assert.NoError(t, err, "the imported guest is deleted with the VM that took it over")
	})
}

// libvirtForeign defines and starts a domain with go-libvirt directly, as
// virsh would: no virtfleet metadata.
func libvirtForeign(t *testing.T, h *hub, node, _ string) string {
	t.Helper()
	// A host's own guest on the host's own network, with its DHCP range:
	// virtfleet's networks serve only the hub's addresses, and a guest
	// made there by hand would have none.
	const network = "default"
	l, err := h.s.Nodes[node].Dial()
	require.NoError(t, err)
	defer func() { _ = l.Disconnect() }()
	dom := libvirtxml.Domain{
		Type: "test", Name: "made-by-hand",
		Memory: &libvirtxml.DomainMemory{Value: 256, Unit: "MiB"},
		VCPU:   &libvirtxml.DomainVCPU{Value: 1},
		OS:     &libvirtxml.DomainOS{Type: &libvirtxml.DomainOSType{Type: "hvm"}},
		Devices: &libvirtxml.DomainDeviceList{Interfaces: []libvirtxml.DomainInterface{{
			Source: &libvirtxml.DomainInterfaceSource{Network: &libvirtxml.DomainInterfaceSourceNetwork{Network: network}},
		}}},
	}
	x, err := dom.Marshal()
	require.NoError(t, err)
	d, err := l.DomainDefineXMLFlags(x, 0)
	require.NoError(t, err)
	require.NoError(t, l.DomainCreate(d))
	return dom.Name
}

// libvirtExists says whether node has a domain named name.
func libvirtExists(t *testing.T, h *hub, node, name string) bool {
	t.Helper()
	l, err := h.s.Nodes[node].Dial()
	require.NoError(t, err)
	defer func() { _ = l.Disconnect() }()
	_, err = l.DomainLookupByName(name)
	if golibvirt.IsNotFound(err) {
		return false
	}
	require.NoError(t, err)
	return true
}

// libvirtInspect reads a domain by name or UUID.
func libvirtInspect(t *testing.T, h *hub, node, name string) (bool, int) {
	t.Helper()
	l, err := h.s.Nodes[node].Dial()
	require.NoError(t, err)
	defer func() { _ = l.Disconnect() }()
	d, err := l.DomainLookupByName(name)
	if err != nil {
		id, perr := uuid.Parse(name)
		require.NoError(t, perr, "no domain %s", name)
		d, err = l.DomainLookupByUUID(golibvirt.UUID(id))
	}
	require.NoError(t, err)
	state, _, _, vcpus, _, err := l.DomainGetInfo(d)
	require.NoError(t, err)
	return golibvirt.DomainState(state) == golibvirt.DomainRunning, int(vcpus)
}

// assertSameGuests checks that a node has as many guests as before, each
// once. The keys may differ: a backend that counts guests by the uid of the
// VM managing them sees an adopted guest under its new VM's uid.
func assertSameGuests(t *testing.T, before, after map[string]int, msg string) {
	t.Helper()
	total := func(m map[string]int) int {
		n := 0
		for uid, c := range m {
			assert.Equal(t, 1, c, "%s: guest %s exists %d times", msg, uid, c)
			n += c
		}
		return n
	}
	assert.Equal(t, total(before), total(after), "%s: %v, then %v", msg, before, after)
}

// novaForeign makes a server through the Nova API as a user would: a
// bootable Cinder volume, a flavor of its own, one port on network.
func novaForeign(t *testing.T, _ *hub, _, network string) string {
	t.Helper()
	ctx := context.Background()
	cl, err := openstack.ForTest(t).Clients(ctx)
	require.NoError(t, err)
	vol, err := volumes.Create(ctx, cl.Volume, volumes.CreateOpts{Size: 1, Name: "made-by-hand-root"}, nil).Extract()
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		v, err := volumes.Get(ctx, cl.Volume, vol.ID).Extract()
		return err == nil && v.Status == "available"
	}, 2*time.Minute, time.Second, "the volume becomes available")
	require.NoError(t, volumes.SetBootable(ctx, cl.Volume, vol.ID, volumes.BootableOpts{Bootable: true}).ExtractErr())
	fl, err := flavors.Create(ctx, cl.Compute, flavors.CreateOpts{Name: "made-by-hand", VCPUs: 1, RAM: 128, Disk: ptr(0)}).Extract()
	require.NoError(t, err)
	page, err := networks.List(cl.Network, networks.ListOpts{Name: network}).AllPages(ctx)
	require.NoError(t, err)
	nets, err := networks.ExtractNetworks(page)
	require.NoError(t, err)
	require.NotEmpty(t, nets, "network %s", network)
	s, err := servers.Create(ctx, cl.Compute, servers.CreateOpts{
		Name: "made-by-hand", FlavorRef: fl.ID, Networks: []servers.Network{{UUID: nets[0].ID}},
		BlockDevice: []servers.BlockDevice{{SourceType: servers.SourceVolume, DestinationType: servers.DestinationVolume, UUID: vol.ID, BootIndex: 0}},
	}, nil).Extract()
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		got, err := servers.Get(ctx, cl.Compute, s.ID).Extract()
		return err == nil && got.Status == "ACTIVE"
	}, 3*time.Minute, time.Second, "the server becomes ACTIVE")
	return s.ID
}

// novaExists says whether the server with id id is there and not deleted.
func novaExists(t *testing.T, _ *hub, _, id string) bool {
	t.Helper()
	s, err := servers.Get(context.Background(), novaCloud(t).cl.Compute, id).Extract()
	if gophercloud.ResponseCodeIs(err, http.StatusNotFound) {
		return false
	}
	require.NoError(t, err)
	return s.Status != "DELETED" && s.Status != "SOFT_DELETED"
}

// novaInspect reads a server by id.
func novaInspect(t *testing.T, _ *hub, _, id string) (bool, int) {
	t.Helper()
	s := novaCloud(t).server(t, id)
	vcpus, _ := s.Flavor["vcpus"].(float64)
	return s.Status == "ACTIVE", int(vcpus)
}

// kubevirtForeign creates a VirtualMachine in the node's KubeVirt cluster
// with the kubevirt client, as a KubeVirt user would: no virtfleet labels,
// its own name, on the network's NetworkAttachmentDefinition.
func kubevirtForeign(t *testing.T, h *hub, node, network string) string {
	t.Helper()
	c := h.s.KubeVirt(node)
	require.NotNil(t, c, "node %s runs no KubeVirt", node)
	vm := kubevirttest.HandMadeVM(c.Namespace, "made-by-hand", kubevirt.ObjectName(network))
	require.NoError(t, c.Client.Create(context.Background(), vm))
	require.Eventually(t, func() bool {
		running, _ := kubevirtInspect(t, h, node, vm.Name)
		return running
	}, time.Minute, 100*time.Millisecond, "KubeVirt runs %s", vm.Name)
	return vm.Name
}

// kubevirtVM reads the node's KubeVirt VirtualMachine whose name or uid is
// name, or nil.
func kubevirtVM(t *testing.T, h *hub, node, name string) *kubevirtv1.VirtualMachine {
	t.Helper()
	c := h.s.KubeVirt(node)
	require.NotNil(t, c, "node %s runs no KubeVirt", node)
	vms := &kubevirtv1.VirtualMachineList{}
	require.NoError(t, c.Client.List(context.Background(), vms, client.InNamespace(c.Namespace)))
	for i, vm := range vms.Items {
		if vm.Name == name || string(vm.UID) == name {
			return &vms.Items[i]
		}
	}
	return nil
}

// kubevirtInspect reads a VirtualMachine by name or uid: whether its VMI
// runs, and the vCPUs of the VMI, or of its template when it has none.
func kubevirtInspect(t *testing.T, h *hub, node, name string) (bool, int) {
	t.Helper()
	vm := kubevirtVM(t, h, node, name)
	require.NotNil(t, vm, "no KubeVirt VirtualMachine %s", name)
	vmi := &kubevirtv1.VirtualMachineInstance{}
	err := h.s.KubeVirt(node).Client.Get(context.Background(), client.ObjectKeyFromObject(vm), vmi)
	if kerrors.IsNotFound(err) {
		return false, vcpus(vm.Spec.Template.Spec.Domain.CPU)
	}
	require.NoError(t, err)
	return vmi.Status.Phase == kubevirtv1.Running, vcpus(vmi.Spec.Domain.CPU)
}

func vcpus(c *kubevirtv1.CPU) int {
	if c == nil {
		return 1
	}
	return int(max(c.Cores, 1) * max(c.Sockets, 1) * max(c.Threads, 1))
}

// kubevirtExists says whether the node has a VirtualMachine whose name or
// uid is name.
func kubevirtExists(t *testing.T, h *hub, node, name string) bool {
	t.Helper()
	return kubevirtVM(t, h, node, name) != nil
}
