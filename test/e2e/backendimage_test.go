package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/blockstorage/v3/volumes"
	"github.com/gophercloud/gophercloud/v2/openstack/image/v2/images"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/networks"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"

	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/agent/driver/kubevirt"
	"github.com/virtfleet/virtfleet/agent/driver/nova"
	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/harness/diskimagetest"
	"github.com/virtfleet/virtfleet/internal/harness/guesthost"
	"github.com/virtfleet/virtfleet/internal/harness/guestimage"
	"github.com/virtfleet/virtfleet/internal/harness/openstack"
)

// bootImage is the image testBootFromImage serves: a real qcow2 of a
// 32 MiB disk, zero but for bootMarker at bootMarkerAt, where the test
// looks for it on the boot disk the backend made.
const (
	bootImageSize = 32 << 20
	bootMarkerAt  = 1 << 20
)

var bootMarker = []byte("virtfleet: this disk was made from its DiskImage")

// testBootFromImage boots a VM of backend from a Volume made from a
// DiskImage served over HTTP, each backend through its own image path: on
// nova the agent's verified upload to Glance, shared by the cloud, and a
// bootable Cinder volume created from it; on kubevirt a CDI DataVolume
// after the agent verified the image's sha256. Either way the boot disk
// holds the image's bytes where a guest reads them. On nova, the image
// stays in Glance after its last Volume went, until its pruneAfter.
func testBootFromImage(t *testing.T, h *hub, backend, node string, on func(*v1alpha1.VirtualMachine) *v1alpha1.VirtualMachine) {
	ctx := context.Background()
	data, err := diskimagetest.Marked(t.TempDir(), bootImageSize, bootMarkerAt, bootMarker)
	require.NoError(t, err)
	sum := sha256.Sum256(data)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.ServeContent(w, r, "debian.qcow2", time.Time{}, bytes.NewReader(data))
	}))
	t.Cleanup(srv.Close)
	h.create(t, &v1alpha1.DiskImage{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "debian"},
		Spec: v1alpha1.DiskImageSpec{ForProvider: v1alpha1.DiskImageParameters{
			Source:     v1alpha1.DiskImageSource{URL: srv.URL + "/debian.qcow2", SHA256: hex.EncodeToString(sum[:])},
			PruneAfter: &metav1.Duration{Duration: imagePruneAfter},
		}},
	})
	uid := string(h.diskImage(t, "debian").UID)
	h.create(t, imageVolume("booted-root", "debian"))
	h.create(t, on(vmWith("booted", "booted-root")))

	t.Run("BootsFromTheDiskImage", func(t *testing.T) {
		vm := h.wait(t, "booted", 3*time.Minute, running)
		assert.Equal(t, node, vm.GetAnnotations()[v1alpha1.AnnotationNode])
		switch backend {
		case driver.BackendNova:
			n := novaCloud(t)
			boot := n.volume(t, ns+"_booted-root")
			assert.Equal(t, "true", boot.Bootable, "Cinder marks a volume made from an image bootable")
			img := n.image(t, boot.VolumeImageMetadata["image_id"])
			assert.Equal(t, nova.ImageName(uid), img.Name, "the boot volume was made from the DiskImage's Glance image")
			assert.Equal(t, int64(len(data)), img.SizeBytes, "Glance holds the verified download")
			assert.Equal(t, "qcow2", boot.VolumeImageMetadata["disk_format"], "with the image's metadata")
			assertMarked(t, openstack.ForTest(t).VolumePath(boot.ID), "the Cinder volume")
		case driver.BackendKubeVirt:
			cluster := h.s.KubeVirt(node)
			dv := &cdiv1.DataVolume{}
			name := kubevirt.ObjectName(ns + "_booted-root")
			require.NoError(t, cluster.Client.Get(ctx, types.NamespacedName{Namespace: cluster.Namespace, Name: name}, dv))
			require.NotNil(t, dv.Spec.Source.HTTP, "an http import")
			assert.Equal(t, srv.URL+"/debian.qcow2", dv.Spec.Source.HTTP.URL)
			assert.Equal(t, cdiv1.Succeeded, dv.Status.Phase)
			imported, ok := cluster.CDI.Imported(types.NamespacedName{Namespace: cluster.Namespace, Name: name})
			require.True(t, ok, "CDI imported the disk")
			assert.Equal(t, hex.EncodeToString(sum[:]), imported.SHA256, "the bytes served are the bytes imported")
		}
		di := h.waitImage(t, "debian", 30*time.Second, func(img *v1alpha1.DiskImage) bool {
			return img.Status.AtProvider.Users == 1
		})
		if backend == driver.BackendNova {
			di = h.waitImage(t, "debian", 30*time.Second, func(img *v1alpha1.DiskImage) bool {
				return img.Status.AtProvider.Phase == v1alpha1.ImagePhaseReady && len(img.Status.AtProvider.Nodes) == 1
			})
			assert.Equal(t, []string{node}, di.Status.AtProvider.Nodes, "the nova node reports the cloud's Glance image")
		}
	})

	t.Run("AnImageInUseCannotBeDeleted", func(t *testing.T) {
		require.NoError(t, h.kube.Delete(ctx, &v1alpha1.DiskImage{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "debian"}}))
		require.Eventually(t, func() bool {
			return h.hasEvent(t, "debian", "DeletionBlocked", "DiskImage debian is used by Volume booted-root")
		}, 30*time.Second, 100*time.Millisecond, "a refused deletion records an event")
	})

	t.Run("TheImageGoesAfterItsLastVolumeAndItsPruneAfter", func(t *testing.T) {
		var n novaView
		if backend == driver.BackendNova {
			// Logged in before the Volume goes: a login slow under load
			// must not delay the look at the cloud.
			n = novaCloud(t)
		}
		h.delete(t, "booted")
		require.NoError(t, h.kube.Delete(ctx, &v1alpha1.Volume{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "booted-root"}}))
		// pruneAfter runs from when the Volume is gone, after this: the
		// time from here until the image is seen gone is at least the
		// time it stayed, whatever slows the looks at the cloud.
		released := time.Now()
		require.Eventually(t, func() bool {
			return kerrors.IsNotFound(h.kube.Get(ctx, types.NamespacedName{Namespace: ns, Name: "debian"}, &v1alpha1.DiskImage{}))
		}, 60*time.Second, 100*time.Millisecond, "the DiskImage goes once no Volume uses it")
		if backend != driver.BackendNova {
			return
		}
		name := nova.ImageName(uid)
		require.Eventually(t, func() bool { return len(n.images(t, name)) == 0 }, imagePruneAfter+30*time.Second, 200*time.Millisecond,
			"the Glance image is pruned after its pruneAfter")
		stayed := time.Since(released)
		assert.GreaterOrEqual(t, stayed, imagePruneAfter, "the Glance image stays after its last Volume went, for its pruneAfter (%s)", imagePruneAfter)
		t.Logf("Glance image seen pruned %s after its last Volume was deleted (pruneAfter %s)", stayed, imagePruneAfter)
	})
}

// assertMarked checks that the raw disk in file holds bootMarker where
// the image put it.
func assertMarked(t *testing.T, file, what string) {
	t.Helper()
	f, err := os.Open(file)
	require.NoError(t, err, "%s's file", what)
	defer func() { _ = f.Close() }()
	got := make([]byte, len(bootMarker))
	_, err = f.ReadAt(got, bootMarkerAt)
	require.NoError(t, err)
	assert.Equal(t, string(bootMarker), string(got), "%s holds the image's bytes as the guest reads them", what)
}

// volume is the Cinder volume named name, read as the admin.
func (n novaView) volume(t *testing.T, name string) *volumes.Volume {
	t.Helper()
	page, err := volumes.List(n.cl.Volume, volumes.ListOpts{AllTenants: true, Name: name}).AllPages(context.Background())
	require.NoError(t, err)
	all, err := volumes.ExtractVolumes(page)
	require.NoError(t, err)
	require.Len(t, all, 1, "one Cinder volume %s", name)
	return &all[0]
}

// image is the Glance image id.
func (n novaView) image(t *testing.T, id string) *images.Image {
	t.Helper()
	require.NotEmpty(t, id, "the volume names the image it was made from")
	img, err := images.Get(context.Background(), n.cl.Image, id).Extract()
	require.NoError(t, err)
	return img
}

// images are the ids of the Glance images named name.
func (n novaView) images(t *testing.T, name string) []string {
	t.Helper()
	page, err := images.List(n.cl.Image, images.ListOpts{Name: name}).AllPages(context.Background())
	require.NoError(t, err)
	all, err := images.ExtractImages(page)
	require.NoError(t, err)
	var ids []string
	for _, im := range all {
		ids = append(ids, im.ID)
	}
	return ids
}

func (h *hub) diskImage(t *testing.T, name string) *v1alpha1.DiskImage {
	t.Helper()
	img := &v1alpha1.DiskImage{}
	require.NoError(t, h.kube.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, img))
	return img
}

// testRealNovaGuest boots the example Debian image on the test cloud's
// real compute host as a user would: a DiskImage at a URL, a Volume from
// it, a VirtualNetwork importing the site's network, a VirtualMachine with
// a public key. The hub places it on the nova node, whose agent imports
// the image into Glance and boots the server from a volume made of it;
// ssh with the VM's key reaches the guest at the VM's status address.
// Then a snapshot of the guest is restored into it (testRealNovaSnapshot),
// and the guest is backed up and a new VM made from its backup
// (testRealNovaBackup), on the same host.
// Each boot holds the machine's guest boot lock (guestimage.HoldBoot).
func testRealNovaGuest(t *testing.T, h *hub, on func(*v1alpha1.VirtualMachine) *v1alpha1.VirtualMachine) {
	t.Run("TheExampleImageBootsOnARealComputeHostAndAnswersSSH", func(t *testing.T) {
		ctx := context.Background()
		imagePath, err := guestimage.Ensure(ctx, io.Discard)
		require.NoError(t, err, "the guest image")
		cloud := openstack.ForTest(t)
		start := time.Now()
		host, err := cloud.StartRealCompute(ctx)
		require.NoError(t, err, "logs in %s/logs", cloud.Dir)
		t.Logf("the real compute host %s started in %s", host, time.Since(start).Round(time.Millisecond))
		// Afterwards it takes no more servers: the other scenarios' VMs are
		// on the suite's VXLAN network, which it does not carry.
		t.Cleanup(func() { assert.NoError(t, cloud.SetHostEnabled(ctx, host, false, "only for the real-guest scenario")) })
		// Nova's scheduler may choose only the real host meanwhile.
		require.NoError(t, cloud.SetHostEnabled(ctx, cloud.ComputeHost, false, "a test boots on the real host"))
		t.Cleanup(func() { assert.NoError(t, cloud.SetHostEnabled(ctx, cloud.ComputeHost, true, "")) })
		const lan = "vf-e2e-lan"
		lanID, err := cloud.GuestNetwork(ctx, lan, "10.253.0.0/24")
		require.NoError(t, err)
		t.Cleanup(func() {
			n := novaCloud(t)
			assert.Eventually(t, func() bool {
				err := networks.Delete(ctx, n.cl.Network, lanID).ExtractErr()
				return err == nil || gophercloud.ResponseCodeIs(err, http.StatusNotFound)
			}, 5*time.Minute, time.Second, "the guest network goes once the server is gone")
		})

		sum := sha256.New()
		f, err := os.Open(imagePath) //nolint:gosec // the harness's image
		require.NoError(t, err)
		_, err = io.Copy(sum, f)
		_ = f.Close()
		require.NoError(t, err)
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { http.ServeFile(w, r, imagePath) }))
		t.Cleanup(srv.Close)
		key := filepath.Join(t.TempDir(), "id_ed25519")
		out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", key).CombinedOutput()
		require.NoError(t, err, "ssh-keygen: %s", out)
		pub, err := os.ReadFile(key + ".pub") //nolint:gosec // the test's own key
		require.NoError(t, err)

		h.create(t, &v1alpha1.DiskImage{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "debian-12"},
			Spec: v1alpha1.DiskImageSpec{ForProvider: v1alpha1.DiskImageParameters{
				Source: v1alpha1.DiskImageSource{URL: srv.URL + "/debian-12.qcow2", SHA256: hex.EncodeToString(sum.Sum(nil))},
			}},
		})
		root := imageVolume("real-root", "debian-12")
		root.Spec.ForProvider.Size = resource.MustParse("3Gi")
		h.create(t, root)
		h.create(t, &v1alpha1.VirtualNetwork{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "lan", Annotations: map[string]string{meta.AnnotationKeyExternalName: lan}},
			Spec:       v1alpha1.VirtualNetworkSpec{ForProvider: v1alpha1.VirtualNetworkParameters{CIDR: "10.253.0.0/24"}},
		})
		vm := vmWith("real", "real-root")
		vm.Spec.ForProvider.VirtualNetworks = []v1alpha1.LocalName{"lan"}
		vm.Spec.ForProvider.Memory = resource.MustParse("768Mi")
		vm = on(vm)
		vm.Spec.ForProvider.PublicKey = strings.TrimSpace(string(pub))
		booted := guestimage.HoldBoot(ctx, t)
		start = time.Now()
		h.create(t, vm)
		t.Cleanup(func() { h.delete(t, "real") })

		got := h.wait(t, "real", 10*time.Minute, func(vm *v1alpha1.VirtualMachine) bool {
			return running(vm) && len(vm.Status.AtProvider.Interfaces) == 1 && len(vm.Status.AtProvider.Interfaces[0].IPs) > 0
		})
		t.Logf("Running on %s %s after it was created", got.Status.AtProvider.Node, time.Since(start).Round(time.Millisecond))
		require.Equal(t, host, got.Status.AtProvider.Node, "NODE is the real compute host")
		ip := got.Status.AtProvider.Interfaces[0].IPs[0]
		// From the network's DHCP namespace, the one place on the real
		// host the guest's address is reachable from.
		answer, err := guesthost.SSHUntil(ctx, "qdhcp-"+lanID, key, guestimage.DefaultUser, ip, "ip -4 -o addr show scope global", 2*time.Second, 10*time.Minute)
		require.NoError(t, err, "ssh into the guest at its status address %s: %s", ip, answer)
		t.Logf("ssh into the guest %s after the VM was created: %s", time.Since(start).Round(time.Millisecond), answer)
		assert.Contains(t, answer, ip+"/24", "the guest holds its status address")
		booted()

		g := testRealNovaSnapshot(t, h, realGuest{vm: "real", ip: ip, netns: "qdhcp-" + lanID, key: key, pub: vm.Spec.ForProvider.PublicKey})
		testRealNovaBackup(t, h, on, g)
	})
}
