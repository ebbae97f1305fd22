package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"libvirt.org/go/libvirtxml"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/testing/libvirttest"
	"github.com/virtfleet/virtfleet/internal/testing/natstest"
	"github.com/virtfleet/virtfleet/internal/testing/stack"
)

// TestImportVolume imports a libvirt volume made behind virtfleet's back
// into Volumes: observed only, refused to a second Volume, taken over and
// deleted with the full policy; and a Volume of virtfleet's own deleted
// without the Delete policy leaves its volume.
func TestImportVolume(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the whole stack; skipped with -short")
	}
	const (
		node   = "import-volume"
		legacy = "legacy.qcow2"
	)
	h := startStack(t, "vf-import-volume-", stack.Options{Nodes: []string{node}})
	nc, _ := natstest.Connect(t, h.s.NATS, h.s.AgentIdentities[node])
	h.libvirtVolume(t, node, legacy, 3<<30)
	importer := func(name string, policies ...xpv2.ManagementAction) *v1alpha1.Volume {
		v := volume(name)
		meta.SetExternalName(v, legacy)
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
		h.create(t, importer("seen", xpv2.ManagementActionObserve))
		seen = h.waitVolume(t, "seen", 30*time.Second, realSize)
		assert.NotEmpty(t, seen.Status.AtProvider.ID, "the volume's key")
		assert.Equal(t, node, seen.Status.AtProvider.Node)
		assert.Equal(t, "1Gi", seen.Spec.ForProvider.Size.String(), "the spec is not what shows")
	})

	t.Run("ASecondVolumeNamingTheSameVolumeFails", func(t *testing.T) {
		h.create(t, importer("thief"))
		v := h.waitVolume(t, "thief", 30*time.Second, func(v *v1alpha1.Volume) bool { return v.Status.AtProvider.Phase == v1alpha1.PhaseFailed })
		assert.Contains(t, v.GetCondition(xpv2.TypeReady).Message, "already managed by Volume "+ns+"/seen")
		h.deleteObject(t, v)
		assert.True(t, h.nodeVolumeExists(t, node, legacy), "deleting the refused Volume, even with Delete, leaves the volume")
	})

	t.Run("DeletingTheObserverLeavesTheVolume", func(t *testing.T) {
		h.deleteObject(t, seen)
		assert.True(t, h.nodeVolumeExists(t, node, legacy))
		key, err := wire.VolumeIntentKey(node, string(seen.UID))
		require.NoError(t, err)
		require.Eventually(t, func() bool {
			return !kvHas(t, nc, wire.BucketIntents, key) && !kvHas(t, nc, wire.BucketReports, key)
		}, 30*time.Second, 100*time.Millisecond, "the import's intent and report go")
	})

	t.Run("TheFullPolicyDeletesTheImportedVolume", func(t *testing.T) {
		h.create(t, importer("taken"))
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
		assert.True(t, h.nodeVolumeExists(t, node, wire.NodeName(ns, "own")), "the volume stays")
	})
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

// deleteObject deletes o and waits until the hub finalized it.
func (h *hub) deleteObject(t *testing.T, o client.Object) {
	t.Helper()
	require.NoError(t, h.kube.Delete(context.Background(), o))
	require.Eventually(t, func() bool {
		return kerrors.IsNotFound(h.kube.Get(context.Background(), client.ObjectKeyFromObject(o), o))
	}, 30*time.Second, 100*time.Millisecond, "%T %s was not finalized", o, o.GetName())
}
