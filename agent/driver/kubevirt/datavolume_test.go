package kubevirt

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	kubevirtv1 "kubevirt.io/api/core/v1"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"

	"github.com/virtfleet/virtfleet/agent/driver"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/harness/kubevirttest"
)

// loopback lets an image come from the test's server: the node's source
// policy refuses loopback addresses unless an image allows them.
var loopback = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}

// imageServer serves body at /image on 127.0.0.1 as an image server would,
// with its length. While hold is set it sends the first half and waits
// for release; status, when set, is answered instead of the body.
type imageServer struct {
	*httptest.Server
	body    []byte
	status  atomic.Int32
	hold    atomic.Bool
	release chan struct{}
}

func newImageServer(t *testing.T, body []byte) *imageServer {
	t.Helper()
	s := &imageServer{body: body, release: make(chan struct{})}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if code := int(s.status.Load()); code != 0 {
			http.Error(w, http.StatusText(code), code)
			return
		}
		w.Header().Set("Content-Length", strconv.Itoa(len(s.body)))
		half := len(s.body) / 2
		if !s.hold.Load() {
			half = len(s.body)
		}
		_, _ = w.Write(s.body[:half])
		w.(http.Flusher).Flush()
		if half < len(s.body) {
			select {
			case <-s.release:
			case <-r.Context().Done():
				return
			}
			_, _ = w.Write(s.body[half:])
		}
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *imageServer) url() string { return s.URL + "/image" }

func (s *imageServer) sum() string {
	sum := sha256.Sum256(s.body)
	return hex.EncodeToString(sum[:])
}

// testImage is bytes of an image: what it holds does not matter to CDI's
// stand-in, which only counts and hashes them.
func testImage(seed byte) []byte {
	b := make([]byte, 64<<10)
	for i := range b {
		b[i] = byte(i*7) ^ seed
	}
	return b
}

// imageMachine is e.machine whose boot disk is made from an image at url.
func (e *env) imageMachine(url string) driver.Machine {
	m := e.machine()
	m.Disks[0].Image = &driver.Image{UID: "a4f1e2c0-5b7d-4e8a-9c3f-1d2e3f4a5b6c", Name: "debian", URL: url, AllowedSources: loopback}
	return m
}

func (e *env) dataVolume(disk driver.Disk) (*cdiv1.DataVolume, error) {
	dv := &cdiv1.DataVolume{}
	err := e.kube.Get(context.Background(), types.NamespacedName{Namespace: e.ns, Name: ObjectName(disk.Name)}, dv)
	return dv, err
}

func TestNewDataVolumeImportsTheImageIntoTheDisk(t *testing.T) {
	disk := driver.Disk{
		Name: "team-a_db-root", SizeBytes: 10 << 30, Pool: "fast",
		Image: &driver.Image{UID: "3f1c0a2e-1111-4222-8333-944455566677", Name: "debian", URL: "https://images.example/debian-12.qcow2"},
	}
	dv, err := newDataVolume(disk, "vms", corev1.ReadWriteMany)
	require.NoError(t, err)
	assert.Equal(t, "vms", dv.Namespace)
	assert.Equal(t, "team-a.db-root", dv.Name, "the disk's PVC name")
	assert.Equal(t, map[string]string{labelManagedBy: managedBy, LabelImageUID: disk.Image.UID}, dv.Labels)
	assert.Equal(t, "debian", dv.Annotations[AnnotationImageName])
	require.NotNil(t, dv.Spec.Source)
	require.NotNil(t, dv.Spec.Source.HTTP)
	assert.Equal(t, disk.Image.URL, dv.Spec.Source.HTTP.URL)
	assert.Nil(t, dv.Spec.PVC, "CDI's storage API, with the storage profile's defaults")
	require.NotNil(t, dv.Spec.Storage)
	assert.Equal(t, int64(10<<30), dv.Spec.Storage.Resources.Requests.Storage().Value())
	assert.Equal(t, []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany}, dv.Spec.Storage.AccessModes, "the driver's access mode, as for its PVCs")
	assert.Equal(t, "fast", *dv.Spec.Storage.StorageClassName, "the pool is the storage class")
	assert.Nil(t, dv.Spec.Storage.VolumeMode)
}

// TestImportsTheNodeRefuses: what the node's source policy refuses and
// what CDI cannot import as the contract asks are terminal.
func TestImportsTheNodeRefuses(t *testing.T) {
	backup := &wire.ImageBackup{Namespace: "team-a", ID: "b-1", Disk: "root"}
	cases := map[string]struct {
		disk func(*driver.Disk)
		// want is in the refusal; empty for an import the node makes.
		want string
	}{
		"HTTP":               {disk: func(*driver.Disk) {}},
		"HTTPS":              {disk: func(d *driver.Disk) { d.Image.URL = "https://127.0.0.1/debian.qcow2" }},
		"FTP":                {disk: func(d *driver.Disk) { d.Image.URL = "ftp://127.0.0.1/debian.qcow2" }, want: `scheme "ftp"`},
		"File":               {disk: func(d *driver.Disk) { d.Image.URL = "file:///etc/shadow" }, want: `scheme "file"`},
		"NotAURL":            {disk: func(d *driver.Disk) { d.Image.URL = "http://bad host/x" }, want: "bad host"},
		"LoopbackNotAllowed": {disk: func(d *driver.Disk) { d.Image.AllowedSources = nil }, want: "loopback"},
		"LinkLocal":          {disk: func(d *driver.Disk) { d.Image.URL = "http://169.254.169.254/latest/meta-data" }, want: "link-local"},
		"ByExternalName":     {disk: func(d *driver.Disk) { d.Image.URL, d.Image.ExternalName = "", "golden" }, want: `imports "golden" by external name`},
		"FromAVolume":        {disk: func(d *driver.Disk) { d.Image.URL, d.Image.SourceVolume = "", "default_golden" }, want: "imports images from http and https URLs only"},
		"FromASnapshot": {disk: func(d *driver.Disk) {
			d.Image.URL, d.Image.SourceVolume, d.Image.SourceSnapshot = "", "team-a_web-root", "5e2a"
		}, want: "copy of volume team-a_web-root as it was in snapshot 5e2a: the kubevirt backend keeps that snapshot as KubeVirt's own"},
		"FromABackup":    {disk: func(d *driver.Disk) { d.Image.URL, d.Image.Backup = "", backup }, want: "backup team-a/b-1: the kubevirt backend cannot make an image from a backup yet"},
		"NoSize":         {disk: func(d *driver.Disk) { d.SizeBytes = 0 }, want: "needs a size of at least 1Mi"},
		"SmallerThan1Mi": {disk: func(d *driver.Disk) { d.SizeBytes = 512 << 10 }, want: "needs a size of at least 1Mi"},
		"UIDNotALabel":   {disk: func(d *driver.Disk) { d.Image.UID = "not a uid" }, want: "cannot label a DataVolume"},
		"UIDMissing":     {disk: func(d *driver.Disk) { d.Image.UID = "" }, want: "cannot label a DataVolume"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			disk := driver.Disk{Name: "team-a_db-root", SizeBytes: 1 << 30, Image: &driver.Image{UID: "3f1c", Name: "debian", URL: "http://127.0.0.1/debian.qcow2", AllowedSources: loopback}}
			tc.disk(&disk)
			_, err := newDataVolume(disk, "vms", corev1.ReadWriteOnce)
			if err == nil {
				// Without a SHA256 the URL alone is checked: the driver
				// downloads nothing.
				_, err = (&Driver{}).checkImageSource(context.Background(), disk.Image)
			}
			if tc.want == "" {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.True(t, driver.IsTerminal(err), "terminal: %v", err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

// TestDiskFromAnImage imports an image through CDI's stand-in: the disk
// becomes a DataVolume, Ensure reports its progress while CDI imports, and
// the guest runs once the bytes the server served are on its PVC.
func TestDiskFromAnImage(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	srv := newImageServer(t, testImage(1))
	srv.hold.Store(true)
	m := e.imageMachine(srv.url())

	o, err := e.d.Ensure(ctx, m)
	require.NoError(t, err)
	assert.Equal(t, driver.PhaseProvisioning, o.Phase, "Ensure does not wait for the import")
	assert.Contains(t, o.Message, "importing image debian: ")

	dv, err := e.dataVolume(m.Disks[0])
	require.NoError(t, err)
	assert.Equal(t, srv.url(), dv.Spec.Source.HTTP.URL)
	assert.Equal(t, m.Disks[0].SizeBytes, dv.Spec.Storage.Resources.Requests.Storage().Value())
	assert.Equal(t, managedBy, dv.Labels[labelManagedBy])
	assert.Equal(t, m.Disks[0].Image.UID, dv.Labels[LabelImageUID])
	volumes := e.vm(m.UID).Spec.Template.Spec.Volumes
	require.NotNil(t, volumes[0].DataVolume, "the guest's volume is the DataVolume")
	assert.Equal(t, dv.Name, volumes[0].DataVolume.Name)

	o = e.ensureUntil(m, func(o driver.Observation) bool { return o.Message == "importing image debian: 50.00%" })
	assert.Equal(t, driver.PhaseProvisioning, o.Phase, "CDI's progress while the server holds the second half")
	require.Eventually(t, func() bool {
		got, err := e.d.Observe(ctx, m.UID)
		return err == nil && got.Phase == driver.PhaseProvisioning
	}, 20*time.Second, 50*time.Millisecond, "KubeVirt shows the VM Provisioning")
	vmi := e.vmi(m.UID)
	require.NotNil(t, vmi, "KubeVirt makes the VMI at once")
	assert.Equal(t, kubevirtv1.Pending, vmi.Status.Phase, "and holds it Pending: no guest runs yet")

	close(srv.release)
	o = e.ensureUntil(m, phaseIs(driver.PhaseRunning))
	assert.Empty(t, o.Message)
	imported, ok := cluster.CDI.Imported(types.NamespacedName{Namespace: e.ns, Name: dv.Name})
	require.True(t, ok, "CDI imported the disk")
	assert.Equal(t, srv.sum(), imported.SHA256, "the bytes served are the bytes imported")
	assert.Equal(t, int64(len(srv.body)), imported.Size)
	dv, err = e.dataVolume(m.Disks[0])
	require.NoError(t, err)
	assert.Equal(t, cdiv1.Succeeded, dv.Status.Phase)
	pvc := &corev1.PersistentVolumeClaim{}
	require.NoError(t, e.kube.Get(ctx, types.NamespacedName{Namespace: e.ns, Name: dv.Name}, pvc))
	assert.True(t, metav1.IsControlledBy(pvc, dv), "CDI's PVC, owned by the DataVolume")
	assert.Equal(t, managedBy, pvc.Labels[labelManagedBy], "with the DataVolume's labels")
	assert.Equal(t, kubevirttest.LabelCDIValue, pvc.Labels[kubevirttest.LabelCDIKey])
}

// TestAFailingImportIsFailing: CDI keeps an import whose server answers
// 404 in progress, restarting its importer; Ensure reports it Failing with
// CDI's reason until the server serves the image.
func TestAFailingImportIsFailing(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	srv := newImageServer(t, testImage(2))
	srv.status.Store(http.StatusNotFound)
	m := e.imageMachine(srv.url())

	var err error
	require.Eventually(t, func() bool {
		_, err = e.d.Ensure(ctx, m)
		return driver.IsFailing(err)
	}, 20*time.Second, 50*time.Millisecond, "last error %v", &err)
	assert.Contains(t, err.Error(), "expected status code 200, got 404", "CDI's reason")
	assert.Contains(t, err.Error(), "image debian")
	assert.False(t, driver.IsTerminal(err), "CDI retries: the import may yet succeed")
	require.Eventually(t, func() bool {
		dv, err := e.dataVolume(m.Disks[0])
		return err == nil && dv.Status.RestartCount >= 2 && dv.Status.Phase == cdiv1.ImportInProgress
	}, 20*time.Second, 50*time.Millisecond, "CDI restarts the importer")

	srv.status.Store(0)
	e.ensureUntil(m, phaseIs(driver.PhaseRunning))
	imported, ok := cluster.CDI.Imported(types.NamespacedName{Namespace: e.ns, Name: ObjectName(m.Disks[0].Name)})
	require.True(t, ok)
	assert.Equal(t, srv.sum(), imported.SHA256)
}

// TestAnExistingDiskIsNotRewrittenFromItsImage: a DataVolume or PVC of the
// disk's name is the disk, whoever made it: no DataVolume is made or
// changed, and the node's source policy is not asked about an image no
// import needs.
func TestAnExistingDiskIsNotRewrittenFromItsImage(t *testing.T) {
	e := newEnv(t)
	theirs := newImageServer(t, testImage(3))
	cases := map[string]struct {
		// existing makes the disk before the guest is ensured.
		existing func(t *testing.T, name string)
		// imported is whether CDI imported theirs into the disk.
		imported bool
	}{
		"DataVolume": {
			existing: func(t *testing.T, name string) {
				require.NoError(t, e.kube.Create(context.Background(), &cdiv1.DataVolume{
					ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: name},
					Spec: cdiv1.DataVolumeSpec{
						Source:  &cdiv1.DataVolumeSource{HTTP: &cdiv1.DataVolumeSourceHTTP{URL: theirs.url()}},
						Storage: &cdiv1.StorageSpec{Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("2Gi")}}},
					},
				}))
			},
			imported: true,
		},
		"PVC": {
			existing: func(t *testing.T, name string) {
				require.NoError(t, e.kube.Create(context.Background(), &corev1.PersistentVolumeClaim{
					ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: name},
					Spec: corev1.PersistentVolumeClaimSpec{
						AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
						Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("2Gi")}},
					},
				}))
			},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			// A URL the node would refuse, had it to import it.
			m := e.imageMachine("ftp://images.example/debian.qcow2")
			disk := types.NamespacedName{Namespace: e.ns, Name: ObjectName(m.Disks[0].Name)}
			tc.existing(t, disk.Name)

			e.ensureUntil(m, phaseIs(driver.PhaseRunning))
			dv, err := e.dataVolume(m.Disks[0])
			if tc.imported {
				require.NoError(t, err)
				assert.Equal(t, theirs.url(), dv.Spec.Source.HTTP.URL, "not rewritten")
				assert.Empty(t, dv.Labels[labelManagedBy], "nor taken over")
				imported, ok := cluster.CDI.Imported(disk)
				require.True(t, ok)
				assert.Equal(t, theirs.sum(), imported.SHA256)
			} else {
				assert.True(t, kerrors.IsNotFound(err), "no DataVolume for an existing PVC: %v", err)
			}
		})
	}
}

// TestDeleteVolumeOfADiskFromAnImage deletes the DataVolume and its PVC,
// once no guest uses them.
func TestDeleteVolumeOfADiskFromAnImage(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	srv := newImageServer(t, testImage(4))
	m := e.imageMachine(srv.url())
	e.ensureUntil(m, phaseIs(driver.PhaseRunning))
	key := types.NamespacedName{Namespace: e.ns, Name: ObjectName(m.Disks[0].Name)}

	err := e.d.DeleteVolume(ctx, m.Disks[0])
	assert.True(t, driver.IsInUse(err), "a DataVolume a guest uses stays: %v", err)
	_, err = e.dataVolume(m.Disks[0])
	assert.NoError(t, err)

	require.Eventually(t, func() bool { return e.d.Delete(ctx, m.UID) == nil }, 10*time.Second, 50*time.Millisecond)
	require.Eventually(t, func() bool { return e.d.DeleteVolume(ctx, m.Disks[0]) == nil }, 10*time.Second, 50*time.Millisecond,
		"once the informers no longer show the guest")
	gone := func(obj interface {
		GetDeletionTimestamp() *metav1.Time
	}, err error,
	) bool {
		return kerrors.IsNotFound(err) || (err == nil && obj.GetDeletionTimestamp() != nil)
	}
	dv, err := e.dataVolume(m.Disks[0])
	assert.True(t, gone(dv, err), "the DataVolume is deleted: %v", err)
	pvc := &corev1.PersistentVolumeClaim{}
	err = e.kube.Get(ctx, key, pvc)
	assert.True(t, gone(pvc, err), "and its PVC: %v", err)
	assert.NoError(t, e.d.DeleteVolume(ctx, m.Disks[0]), "deleting it again succeeds")
}

// TestImagesRefusedByTheNodeAreTerminal: Ensure makes nothing for an image
// it refuses.
func TestImagesRefusedByTheNodeAreTerminal(t *testing.T) {
	e := newEnv(t)
	cases := map[string]struct {
		image func(*driver.Image)
		want  string
	}{
		"FTP":      {image: func(i *driver.Image) { i.URL = "ftp://127.0.0.1/debian.qcow2" }, want: `scheme "ftp"`},
		"Loopback": {image: func(i *driver.Image) { i.AllowedSources = nil }, want: "loopback"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			m := e.imageMachine("http://127.0.0.1/debian.qcow2")
			tc.image(m.Disks[0].Image)
			_, err := e.d.Ensure(context.Background(), m)
			require.Error(t, err)
			assert.True(t, driver.IsTerminal(err), "terminal: %v", err)
			assert.Contains(t, err.Error(), tc.want)
			_, err = e.dataVolume(m.Disks[0])
			assert.True(t, kerrors.IsNotFound(err), "no DataVolume: %v", err)
			assert.Zero(t, e.guests(m.UID), "no VM")
		})
	}
}

// TestAnImageWithAChecksumIsVerifiedBeforeCDIImportsIt: CDI verifies no
// checksum of an http import, so the agent downloads an image with a
// SHA256 itself first; a mismatch makes no DataVolume, and a match lets
// CDI import the bytes it verified.
func TestAnImageWithAChecksumIsVerifiedBeforeCDIImportsIt(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	srv := newImageServer(t, testImage(5))

	t.Run("AMismatchMakesNoDataVolume", func(t *testing.T) {
		m := e.imageMachine(srv.url())
		m.Disks[0].Image.UID = "b5e2f3d1-6c8e-4f9b-8d40-2e3f4a5b6c7d"
		m.Disks[0].Image.SHA256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
		var err error
		require.Eventually(t, func() bool {
			_, err = e.d.Ensure(ctx, m)
			return driver.IsFailing(err)
		}, 20*time.Second, 50*time.Millisecond, "last error %v", &err)
		assert.Contains(t, err.Error(), "failed its checksum")
		_, err = e.dataVolume(m.Disks[0])
		assert.True(t, kerrors.IsNotFound(err), "no DataVolume: %v", err)
	})

	t.Run("AMatchIsImported", func(t *testing.T) {
		m := e.imageMachine(srv.url())
		m.Disks[0].Image.SHA256 = srv.sum()
		// The agent inspects what it downloads as the format the image
		// declares; the test's bytes are no qcow2.
		m.Disks[0].Image.Format = "raw"
		o, err := e.d.Ensure(ctx, m)
		require.NoError(t, err)
		assert.Equal(t, driver.PhaseProvisioning, o.Phase)
		assert.Contains(t, o.Message, "importing image debian: ", "the agent's own download, before CDI's")
		e.ensureUntil(m, phaseIs(driver.PhaseRunning))
		imported, ok := cluster.CDI.Imported(types.NamespacedName{Namespace: e.ns, Name: ObjectName(m.Disks[0].Name)})
		require.True(t, ok)
		assert.Equal(t, srv.sum(), imported.SHA256)
	})
}
