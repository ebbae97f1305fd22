package virtualmachine

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/bus"
	"github.com/virtfleet/virtfleet/hub/internal/fleet"
	"github.com/virtfleet/virtfleet/hub/internal/fleet/fleettest"
	"github.com/virtfleet/virtfleet/hub/internal/tenancy"
)

// sealed is o with f's seal of its node and adopted orphan, as the
// placement loop writes them.
func sealed[T metav1.Object](f *fleet.Fleet, o T) T {
	a := o.GetAnnotations()
	meta.AddAnnotations(o, map[string]string{v1alpha1.AnnotationSeal: f.Seal(string(o.GetUID()), a[v1alpha1.AnnotationNode], a[v1alpha1.AnnotationAdopted])})
	return o
}

// TestAdmitNode pins who may put a VM on a node: the placement loop (its
// seal), a node already running the VM's guest, or a namespace granted an
// import or a node of its choosing; nobody else.
func TestAdmitNode(t *testing.T) {
	b := bus.NewFake()
	f := fleettest.Start(t, b)
	other := fleet.New(bus.NewFake(), logging.NewNopLogger()).WithSealKey([]byte("another hub's key"))
	onNode := func(mods ...func(*v1alpha1.VirtualMachine)) *v1alpha1.VirtualMachine {
		return vm(append([]func(*v1alpha1.VirtualMachine){func(v *v1alpha1.VirtualMachine) {
			meta.AddAnnotations(v, map[string]string{v1alpha1.AnnotationNode: testNode})
		}}, mods...)...)
	}
	reported := onNode(func(v *v1alpha1.VirtualMachine) { v.UID = "uid-reported" })
	bus.SetValue(b, wire.GuestReports, testNode, "uid-reported", wire.Report{ProtocolVersion: wire.ProtocolVersion, UID: "uid-reported", Node: testNode, Phase: wire.PhaseRunning})
	require.Eventually(t, func() bool { _, ok := f.Guests.Report(testNode, "uid-reported"); return ok }, 5*time.Second, time.Millisecond)
	imported := func(v *v1alpha1.VirtualMachine) { meta.SetExternalName(v, "vault-01") }
	none := tenancy.Grant{Namespace: "default"}

	cases := map[string]struct {
		vm      *v1alpha1.VirtualMachine
		grant   tenancy.Grant
		refused string
	}{
		"PlacedByTheHub":                        {vm: sealed(f, onNode()), grant: none},
		"NamedByHand":                           {vm: onNode(), grant: none, refused: "(chooseNode: true)"},
		"NamedByHandWhereTheNamespaceMayChoose": {vm: onNode(), grant: tenancy.Grant{ChooseNode: true}},
		"SealedWithAnotherKey":                  {vm: sealed(other, onNode()), grant: none, refused: "(chooseNode: true)"},
		"SealCopiedToAnotherVM": {vm: onNode(func(v *v1alpha1.VirtualMachine) {
			v.Annotations[v1alpha1.AnnotationSeal] = sealed(f, onNode()).Annotations[v1alpha1.AnnotationSeal]
			v.UID = "uid-copy"
		}), grant: none, refused: "(chooseNode: true)"},
		"SealedThenMovedToAnotherNode": {vm: func() *v1alpha1.VirtualMachine {
			v := sealed(f, onNode())
			v.Annotations[v1alpha1.AnnotationNode] = "node2"
			return v
		}(), grant: none, refused: `names node "node2"`},
		"SealedThenGivenAnOrphanToAdopt": {vm: func() *v1alpha1.VirtualMachine {
			v := sealed(f, onNode())
			v.Annotations[v1alpha1.AnnotationAdopted] = "uid-someone-elses"
			return v
		}(), grant: none, refused: "(chooseNode: true)"},
		"ItsNodeRunsItsGuest":                {vm: reported, grant: none},
		"AnImportWithoutTheGrant":            {vm: onNode(imported), grant: none, refused: "(import: true)"},
		"AnImportEvenSealedNeedsTheGrant":    {vm: sealed(f, onNode(imported)), grant: none, refused: "(import: true)"},
		"AnImportWhereTheNamespaceMayImport": {vm: onNode(imported), grant: tenancy.Grant{Import: true}},
		"ChoosingNodesIsNoLicenceToImport":   {vm: onNode(imported), grant: tenancy.Grant{ChooseNode: true}, refused: "(import: true)"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			err := admitNode(tc.vm, tc.vm.GetAnnotations()[v1alpha1.AnnotationNode], tc.grant, f)
			if tc.refused == "" {
				assert.NoError(t, err)
				return
			}
			var r *tenancy.RefusedError
			require.ErrorAs(t, err, &r)
			assert.Contains(t, err.Error(), tc.refused)
		})
	}
}

// TestAdmit pins what a VM may use beyond its namespace's own: Volumes the
// hub bound (sealed) or that import, networks that import or join a host
// bridge, each only as granted; and the image sources its grant allows.
func TestAdmit(t *testing.T) {
	f := fleettest.Start(t, bus.NewFake())
	bridge := func(name, br string) v1alpha1.VirtualNetwork {
		return v1alpha1.VirtualNetwork{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}, Spec: v1alpha1.VirtualNetworkSpec{ForProvider: v1alpha1.VirtualNetworkParameters{Mode: v1alpha1.NetworkModeBridge, Bridge: br}}}
	}
	importedNet := v1alpha1.VirtualNetwork{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "legacy", Annotations: map[string]string{meta.AnnotationKeyExternalName: "default"}}}
	importedVol := vol("legacy", testNode)
	meta.SetExternalName(importedVol, "legacy.qcow2")
	none := tenancy.Grant{Namespace: "default", ImageSources: []string{"10.0.0.0/8"}}
	importedImage := map[string]*v1alpha1.DiskImage{"golden": {ObjectMeta: metav1.ObjectMeta{Name: "golden", Annotations: map[string]string{meta.AnnotationKeyExternalName: "debian-12-golden"}}}}

	cases := map[string]struct {
		d       dependencies
		grant   tenancy.Grant
		refused string
	}{
		"UnboundVolumesAndOwnNetworks":             {d: dependencies{volumes: []v1alpha1.Volume{*vol("root", "")}, networks: []v1alpha1.VirtualNetwork{{ObjectMeta: metav1.ObjectMeta{Name: "net"}}}}, grant: none},
		"AVolumeTheHubBound":                       {d: dependencies{volumes: []v1alpha1.Volume{*sealed(f, vol("root", testNode))}}, grant: none},
		"AVolumeBoundByHand":                       {d: dependencies{volumes: []v1alpha1.Volume{*vol("root", testNode)}}, grant: none, refused: "the Volume root names node"},
		"AVolumeBoundByHandWhereNodesMayBeChosen":  {d: dependencies{volumes: []v1alpha1.Volume{*vol("root", testNode)}}, grant: tenancy.Grant{ChooseNode: true}},
		"AClonedImagesSourceBoundByHand":           {d: dependencies{volumes: []v1alpha1.Volume{*vol("root", "")}, sources: map[string]*v1alpha1.Volume{"golden": vol("base", testNode)}}, grant: none, refused: "the Volume base names node"},
		"AVolumeThatImports":                       {d: dependencies{volumes: []v1alpha1.Volume{*importedVol}}, grant: none, refused: `the Volume legacy imports "legacy.qcow2"`},
		"AVolumeThatImportsWhereImportsAreGranted": {d: dependencies{volumes: []v1alpha1.Volume{*importedVol}}, grant: tenancy.Grant{Import: true}},
		"ANetworkThatImports":                      {d: dependencies{networks: []v1alpha1.VirtualNetwork{importedNet}}, grant: none, refused: `the VirtualNetwork legacy imports "default"`},
		"AnImageThatImports":                       {d: dependencies{images: importedImage}, grant: none, refused: `the DiskImage golden imports "debian-12-golden"`},
		"AnImageThatImportsWhereImportsAreGranted": {d: dependencies{images: importedImage}, grant: tenancy.Grant{Import: true}},
		"AHostBridgeNotGranted":                    {d: dependencies{networks: []v1alpha1.VirtualNetwork{bridge("mgmt", "br-mgmt")}}, grant: tenancy.Grant{HostBridges: []string{"br0"}}, refused: `joins host bridge "br-mgmt"`},
		"AHostBridgeGranted":                       {d: dependencies{networks: []v1alpha1.VirtualNetwork{bridge("lan", "br0")}}, grant: tenancy.Grant{HostBridges: []string{"br0"}}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			err := tc.d.admit(tc.grant, f.Sealed)
			if tc.refused == "" {
				require.NoError(t, err)
				assert.Equal(t, tc.grant.ImageSources, tc.d.imageSources, "the intent's images may be fetched from what the namespace was granted")
				return
			}
			var r *tenancy.RefusedError
			require.ErrorAs(t, err, &r)
			assert.Contains(t, err.Error(), tc.refused)
		})
	}
}

// TestImagesCarryTheirNamespacesSources: a downloaded image names the
// sources its namespace was granted, and no other; a cloned one none.
func TestImagesCarryTheirNamespacesSources(t *testing.T) {
	machine := vm(func(v *v1alpha1.VirtualMachine) { v.Spec.ForProvider.VirtualNetworks = nil })
	img := &v1alpha1.DiskImage{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "ubuntu", UID: "uid-ubuntu"}, Spec: v1alpha1.DiskImageSpec{ForProvider: v1alpha1.DiskImageParameters{Source: v1alpha1.DiskImageSource{URL: "http://10.1.2.3/ubuntu.qcow2"}}}}
	d, err := resolve(context.Background(), kube(t, fromImage("root", "ubuntu"), vol("data", ""), img), machine, nil)
	require.NoError(t, err)
	f := fleettest.Start(t, bus.NewFake())

	require.NoError(t, d.admit(tenancy.Grant{ImageSources: []string{"10.0.0.0/8"}}, f.Sealed))
	assert.Equal(t, []string{"10.0.0.0/8"}, intent(machine, d).Machine.Disks[0].Image.AllowedSources)

	require.NoError(t, d.admit(tenancy.Grant{}, f.Sealed))
	assert.Empty(t, intent(machine, d).Machine.Disks[0].Image.AllowedSources, "a namespace granted nothing may fetch from the public internet only")
}

// TestAnImageWithoutASourceImportsItsExternalName: a DiskImage with
// neither url nor volumeRef sends the node the image its external-name
// annotation names, to use as it is; without the annotation it has no
// source, and the VM says which field to set.
func TestAnImageWithoutASourceImportsItsExternalName(t *testing.T) {
	machine := vm(func(v *v1alpha1.VirtualMachine) { v.Spec.ForProvider.VirtualNetworks = nil })
	img := &v1alpha1.DiskImage{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "golden", UID: "uid-golden"}}
	f := fleettest.Start(t, bus.NewFake())

	d, err := resolve(context.Background(), kube(t, fromImage("root", "golden"), vol("data", ""), img.DeepCopy()), machine, nil)
	require.NoError(t, err)
	err = d.admit(tenancy.Grant{Import: true}, f.Sealed)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "DiskImage golden has no source: set spec.forProvider.source.url")

	meta.SetExternalName(img, "debian-12-golden")
	d, err = resolve(context.Background(), kube(t, fromImage("root", "golden"), vol("data", ""), img), machine, nil)
	require.NoError(t, err)
	require.NoError(t, d.admit(tenancy.Grant{Import: true, ImageSources: []string{"10.0.0.0/8"}}, f.Sealed))
	ref := intent(machine, d).Machine.Disks[0].Image
	require.NotNil(t, ref)
	assert.Equal(t, "debian-12-golden", ref.ExternalName)
	assert.Empty(t, ref.URL)
	assert.Empty(t, ref.AllowedSources, "nothing is downloaded")
	require.NoError(t, ref.Validate(), "the node can tell where the image comes from")
}

// TestAVolumeOnTheVMsOwnNodeNeedsNoSeal: once the VM is admitted to its
// node, a Volume bound to that same node chooses nothing more, sealed or
// not (bound by a hub from before seals); one bound by hand elsewhere is
// still refused.
func TestAVolumeOnTheVMsOwnNodeNeedsNoSeal(t *testing.T) {
	f := fleettest.Start(t, bus.NewFake())
	placed := sealed(f, vm(func(v *v1alpha1.VirtualMachine) {
		v.Spec.ForProvider.VirtualNetworks = nil
		v.Spec.ForProvider.DiskAttachments = []v1alpha1.DiskAttachment{{Name: "root"}}
		meta.AddAnnotations(v, map[string]string{v1alpha1.AnnotationNode: testNode})
	}))
	cases := map[string]struct {
		root    *v1alpha1.Volume
		refused bool
	}{
		"UnsealedOnTheVMsNode":      {root: vol("root", testNode)},
		"UnsealedOnAnotherNode":     {root: vol("root", "node2"), refused: true},
		"SealedOnTheVMsNode":        {root: sealed(f, vol("root", testNode))},
		"UnboundAndWaitingForTheVM": {root: vol("root", "")},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			e := &external{connector: &connector{kube: kube(t, tc.root)}, fleet: f, grant: tenancy.Grant{Namespace: "default"}}
			_, err := e.resolve(context.Background(), placed)
			if !tc.refused {
				assert.NoError(t, err)
				return
			}
			var r *tenancy.RefusedError
			assert.ErrorAs(t, err, &r)
		})
	}
}

// TestAnImageFromABackupCarriesItsLocation: a DiskImage made from a backup
// needs its namespace granted the location, waits while the location or
// its Secret is missing, and then hands the node the location with its
// credentials and the backup of the image's own namespace, as a raw image.
func TestAnImageFromABackupCarriesItsLocation(t *testing.T) {
	machine := vm(func(v *v1alpha1.VirtualMachine) { v.Spec.ForProvider.VirtualNetworks = nil })
	img := &v1alpha1.DiskImage{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "restored", UID: "uid-restored"}, Spec: v1alpha1.DiskImageSpec{ForProvider: v1alpha1.DiskImageParameters{
		Source: v1alpha1.DiskImageSource{Backup: &v1alpha1.DiskImageBackupSource{Location: "offsite", ID: "b-1", Disk: "root"}},
	}}}
	location := &v1alpha1.BackupLocation{ObjectMeta: metav1.ObjectMeta{Name: "offsite"}, Spec: v1alpha1.BackupLocationSpec{
		Endpoint: "s3.example:9000", Bucket: "vms", CredentialsSecretRef: xpv2.SecretReference{Namespace: "ops", Name: "s3"},
	}}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ops", Name: "s3"}, Data: map[string][]byte{
		v1alpha1.BackupAccessKeyID: []byte("AK"), v1alpha1.BackupSecretAccessKey: []byte("SK"),
	}}
	f := fleettest.Start(t, bus.NewFake())
	objs := []client.Object{fromImage("root", "restored"), vol("data", ""), img}

	d, err := resolve(context.Background(), kube(t, objs...), machine, nil)
	require.NoError(t, err)
	var refused *tenancy.RefusedError
	require.ErrorAs(t, d.admit(tenancy.Grant{}, f.Sealed), &refused, "a location is used only where granted")
	require.NoError(t, d.admit(tenancy.Grant{Namespace: "default", BackupLocations: []string{"offsite"}}, f.Sealed))

	err = d.resolveBackups(context.Background(), kube(t, append(objs, location)...))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "DiskImage restored is made from a backup: Secret ops/s3 of BackupLocation offsite does not exist")

	require.NoError(t, d.resolveBackups(context.Background(), kube(t, append(objs, location, secret)...)))
	ref := intent(machine, d).Machine.Disks[0].Image
	require.NotNil(t, ref)
	require.NotNil(t, ref.Backup)
	assert.Equal(t, wire.ImageBackup{
		Location:  wire.BackupLocation{Endpoint: "s3.example:9000", Bucket: "vms", Credentials: wire.BackupCredentials{AccessKeyID: "AK", SecretAccessKey: "SK"}},
		Namespace: "default", ID: "b-1", Disk: "root",
	}, *ref.Backup)
	assert.Equal(t, "raw", ref.Format)
	require.NoError(t, ref.Validate(), "the node can tell where the image comes from")
}

func TestAnotherNamespacesBackupIsRestoredOnlyWhereGranted(t *testing.T) {
	machine := vm(func(v *v1alpha1.VirtualMachine) { v.Spec.ForProvider.VirtualNetworks = nil })
	location := &v1alpha1.BackupLocation{ObjectMeta: metav1.ObjectMeta{Name: "offsite"}, Spec: v1alpha1.BackupLocationSpec{
		Endpoint: "s3.example:9000", Bucket: "vms", CredentialsSecretRef: xpv2.SecretReference{Namespace: "ops", Name: "s3"},
	}}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ops", Name: "s3"}, Data: map[string][]byte{
		v1alpha1.BackupAccessKeyID: []byte("AK"), v1alpha1.BackupSecretAccessKey: []byte("SK"),
	}}
	located := tenancy.Grant{Namespace: "default", BackupLocations: []string{"offsite"}}
	cases := map[string]struct {
		from     string // the DiskImage's source.backup.namespace
		grant    tenancy.Grant
		refused  string // what the refusal names; empty when admitted
		readFrom string // the namespace the node reads the backup from
	}{
		"ItsOwnNamespaceByDefault":          {grant: located, readFrom: "default"},
		"ItsOwnNamespaceNamed":              {from: "default", grant: located, readFrom: "default"},
		"AnotherNamespaceWithoutTheGrant":   {from: "team-a", grant: located, refused: "(restoreFrom: [team-a])"},
		"AnotherNamespaceGrantedByName":     {from: "team-a", grant: withRestoreFrom(located, "team-a"), readFrom: "team-a"},
		"AnotherNamespaceGrantedByStar":     {from: "team-a", grant: withRestoreFrom(located, "*"), readFrom: "team-a"},
		"AThirdNamespaceNotTheOneGranted":   {from: "team-b", grant: withRestoreFrom(located, "team-a"), refused: "(restoreFrom: [team-b])"},
		"TheNamespaceButNotTheLocationIsNo": {from: "team-a", grant: tenancy.Grant{Namespace: "default", RestoreFrom: []string{"team-a"}}, refused: "(backupLocations: [offsite])"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			img := &v1alpha1.DiskImage{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "restored", UID: "uid-restored"}, Spec: v1alpha1.DiskImageSpec{ForProvider: v1alpha1.DiskImageParameters{
				Source: v1alpha1.DiskImageSource{Backup: &v1alpha1.DiskImageBackupSource{Location: "offsite", Namespace: tc.from, ID: "b-1"}},
			}}}
			f := fleettest.Start(t, bus.NewFake())
			objs := []client.Object{fromImage("root", "restored"), vol("data", ""), img, location, secret}
			d, err := resolve(context.Background(), kube(t, objs...), machine, nil)
			require.NoError(t, err)
			err = d.admit(tc.grant, f.Sealed)
			if tc.refused != "" {
				var refused *tenancy.RefusedError
				require.ErrorAs(t, err, &refused)
				assert.Contains(t, err.Error(), tc.refused)
				return
			}
			require.NoError(t, err)
			require.NoError(t, d.resolveBackups(context.Background(), kube(t, objs...)))
			ref := intent(machine, d).Machine.Disks[0].Image
			require.NotNil(t, ref)
			require.NotNil(t, ref.Backup)
			assert.Equal(t, tc.readFrom, ref.Backup.Namespace, "the node reads the backup under this namespace's key")
		})
	}
}

func withRestoreFrom(g tenancy.Grant, namespaces ...string) tenancy.Grant {
	g.RestoreFrom = namespaces
	return g
}
