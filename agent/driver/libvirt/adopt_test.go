package libvirt

import (
	"context"
	"testing"

	golibvirt "github.com/digitalocean/go-libvirt"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"libvirt.org/go/libvirtxml"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/internal/harness/libvirttest"
)

// domainState is the libvirt state of the domain with UUID key.
func domainState(t *testing.T, l *golibvirt.Libvirt, key string) golibvirt.DomainState {
	t.Helper()
	dom := domainOf(t, l, key)
	s, _, err := l.DomainGetState(dom, 0)
	require.NoError(t, err)
	return golibvirt.DomainState(s)
}

// running starts a node with the driver's guest web running on it.
func running(t *testing.T, name string) (*libvirttest.Node, *Driver, *golibvirt.Libvirt, driver.Machine) {
	t.Helper()
	node := libvirttest.Start(t, name)
	d := open(t, node)
	m := machine("web")
	_, err := d.Ensure(context.Background(), m)
	require.NoError(t, err)
	return node, d, raw(t, node), m
}

func TestReleaseAndAdopt(t *testing.T) {
	ctx := context.Background()
	node, d, l, old := running(t, "adopt")
	before, _, err := l.ConnectListAllDomains(1, 0)
	require.NoError(t, err)

	require.NoError(t, d.Release(ctx, old.UID, "the-seal"))
	require.NoError(t, d.Release(ctx, old.UID, "the-seal"), "releasing twice succeeds")
	require.NoError(t, d.Delete(ctx, old.UID), "Delete leaves a released guest alone")
	assert.Equal(t, golibvirt.DomainRunning, domainState(t, l, old.UID), "a released guest keeps running")
	assert.True(t, volumeExists(t, l, seedVolume(old.UID)), "and keeps its seed")
	_, err = d.Observe(ctx, old.UID)
	assert.True(t, driver.IsNotFound(err), "a released guest is no longer the uid's: %v", err)
	list, err := d.List(ctx)
	require.NoError(t, err)
	assert.Empty(t, list, "List does not report orphans")
	orphans, err := d.Orphans(ctx)
	require.NoError(t, err)
	require.Len(t, orphans, 1)
	assert.Equal(t, old.UID, orphans[0].UID)
	assert.Equal(t, &driver.VMRef{Namespace: "team-a", Name: "web", Seal: "the-seal"}, orphans[0].OrphanOf, "the orphan keeps its seal")
	c, err := d.Capacity(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(old.VCPU), c.AllocatedVCPU, "an orphan still holds its share of the host")

	next := old
	next.UID = "0b5e3f1a-7c2d-4e8f-9a1b-aaaaaaaaaaaa"
	require.NoError(t, d.Claim(ctx, next, driver.Ref{Orphan: old.UID}))
	require.NoError(t, d.Claim(ctx, next, driver.Ref{Orphan: old.UID}), "claiming again succeeds")
	o, err := d.Ensure(ctx, next)
	require.NoError(t, err)
	assert.Equal(t, driver.PhaseRunning, o.Phase)
	assert.Equal(t, old.UID, o.ID, "the same domain")
	assert.False(t, o.RestartRequired, "the same spec needs no restart")
	all, _, err := l.ConnectListAllDomains(1, 0)
	require.NoError(t, err)
	assert.Len(t, all, len(before), "adopted, not made again")
	orphans, err = d.Orphans(ctx)
	require.NoError(t, err)
	assert.Empty(t, orphans)

	t.Run("AnEventOfTheDomainNamesItsNewOwner", func(t *testing.T) {
		assert.Equal(t, next.UID, d.aliases.ownerOf(old.UID))
	})
	t.Run("ANewDriverFindsTheAdoptedGuest", func(t *testing.T) {
		list, err := open(t, node).List(ctx)
		require.NoError(t, err)
		require.Len(t, list, 1)
		assert.Equal(t, next.UID, list[0].UID)
	})
	t.Run("TheOldUIDsDeleteLeavesIt", func(t *testing.T) {
		require.NoError(t, d.Delete(ctx, old.UID))
		assert.Equal(t, golibvirt.DomainRunning, domainState(t, l, old.UID))
		assert.True(t, volumeExists(t, l, seedVolume(old.UID)))
	})
	t.Run("ADifferentSpecShowsRestartRequired", func(t *testing.T) {
		changed := next
		changed.SwapBytes *= 2
		o, err := d.Ensure(ctx, changed)
		require.NoError(t, err)
		assert.True(t, o.RestartRequired)
		assert.Equal(t, int32(2), o.VCPU, "the running guest is untouched")
	})
	t.Run("ASecondClaimNamesTheFirst", func(t *testing.T) {
		other := machine("other")
		err := d.Claim(ctx, other, driver.Ref{ExternalName: old.UID})
		require.True(t, driver.IsTerminal(err), "%v", err)
		assert.Contains(t, err.Error(), "VirtualMachine team-a/web")
	})
	t.Run("DeleteOfTheNewOwnerDeletesIt", func(t *testing.T) {
		require.NoError(t, d.Delete(ctx, next.UID))
		_, err := l.DomainLookupByUUID(mustUUID(t, old.UID))
		assert.Error(t, err)
		assert.False(t, volumeExists(t, l, seedVolume(old.UID)))
		c, err := d.Capacity(ctx)
		require.NoError(t, err)
		assert.Zero(t, c.AllocatedVCPU)
	})
}

// TestAnAdoptedDomainGoneIsMadeAgain: a domain undefined behind the agent's
// back (or a libvirtd that lost its state) is made again for the VM that
// adopted it, under the VM's own uid.
func TestAnAdoptedDomainGoneIsMadeAgain(t *testing.T) {
	ctx := context.Background()
	_, d, l, old := running(t, "regone")
	require.NoError(t, d.Release(ctx, old.UID, "the-seal"))
	next := old
	next.UID = "0b5e3f1a-7c2d-4e8f-9a1b-bbbbbbbbbbbb"
	require.NoError(t, d.Claim(ctx, next, driver.Ref{Orphan: old.UID}))

	dom := domainOf(t, l, old.UID)
	require.NoError(t, l.DomainDestroy(dom))
	require.NoError(t, l.DomainUndefine(dom))

	o, err := d.Ensure(ctx, next)
	require.NoError(t, err)
	assert.Equal(t, next.UID, o.ID, "made again under the VM's own uid")
	o, err = d.Observe(ctx, next.UID)
	require.NoError(t, err)
	assert.Equal(t, driver.PhaseRunning, o.Phase)
}

func TestImportByExternalName(t *testing.T) {
	ctx := context.Background()
	node := libvirttest.Start(t, "import")
	d := open(t, node)
	l := raw(t, node)
	foreign := libvirtxml.Domain{
		Type: "test", Name: "made-by-hand",
		Memory: &libvirtxml.DomainMemory{Value: 256, Unit: "MiB"},
		VCPU:   &libvirtxml.DomainVCPU{Value: 1},
		OS:     &libvirtxml.DomainOS{Type: &libvirtxml.DomainOSType{Type: "hvm"}},
	}
	x, err := foreign.Marshal()
	require.NoError(t, err)
	dom, err := l.DomainDefineXMLFlags(x, 0)
	require.NoError(t, err)
	require.NoError(t, l.DomainCreate(dom))
	key := formatUUID(dom.UUID)

	for _, name := range []string{"made-by-hand", key} {
		o, err := d.ObserveRef(ctx, driver.Ref{ExternalName: name})
		require.NoError(t, err, name)
		assert.Equal(t, driver.PhaseRunning, o.Phase)
		assert.Equal(t, int32(1), o.VCPU)
		assert.Equal(t, int64(256<<20), o.MemoryBytes)
		assert.Equal(t, key, o.ID)
	}
	_, err = d.ObserveRef(ctx, driver.Ref{ExternalName: "nope"})
	assert.True(t, driver.IsNotFound(err))

	m := machine("imported")
	m.Running = false
	require.NoError(t, d.Claim(ctx, m, driver.Ref{ExternalName: "made-by-hand"}))
	o, err := d.Ensure(ctx, m)
	require.NoError(t, err)
	assert.Equal(t, driver.PhaseStopped, o.Phase, "the hub manages its power")
	after, err := l.DomainGetXMLDesc(dom, golibvirt.DomainXMLInactive)
	require.NoError(t, err)
	info, err := parseDomain(after)
	require.NoError(t, err)
	assert.Equal(t, int64(1), info.vcpu, "its definition is never rewritten")
	assert.Empty(t, info.volumes)
}
