package reconciler

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/virtfleet/virtfleet/agent/driver"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
)

func TestMachineTranslatesTheImageSource(t *testing.T) {
	base := &wire.SourceVolume{Name: "base", UID: "vol-1"}
	backup := &wire.ImageBackup{
		Location: wire.BackupLocation{Endpoint: "s3.example:9000", Bucket: "backups", Prefix: "site-a", Credentials: wire.BackupCredentials{
			AccessKeyID: "AK", SecretAccessKey: "SK", EncryptionKey: make([]byte, 32),
		}},
		Namespace: "team-a", ID: "b-1", Disk: "root",
	}
	cases := map[string]struct {
		image   wire.ImageRef
		want    *driver.Image
		wantErr string
	}{
		"ADownloadKeepsItsURL": {
			image: wire.ImageRef{Name: "ubuntu", UID: "img-1", URL: "http://127.0.0.1/u.qcow2", Checksum: "ab", PruneAfterSeconds: 60},
			want:  &driver.Image{UID: "img-1", Namespace: "team-a", Name: "ubuntu", URL: "http://127.0.0.1/u.qcow2", SHA256: "ab", PruneAfter: time.Minute},
		},
		"ACloneNamesItsSourceAsTheNodeNamesIt": {
			image: wire.ImageRef{Name: "golden", UID: "img-2", Format: "qcow2", SourceVolume: base},
			want:  &driver.Image{UID: "img-2", Namespace: "team-a", Name: "golden", Format: "qcow2", SourceVolume: "team-a_base"},
		},
		"ASnapshotCopyNamesItsVolumeAndTheSnapshot": {
			image: wire.ImageRef{Name: "golden", UID: "img-4", Format: "qcow2", SourceSnapshot: &wire.SourceSnapshot{Volume: *base, Snapshot: "snap-1"}},
			want:  &driver.Image{UID: "img-4", Namespace: "team-a", Name: "golden", Format: "qcow2", SourceVolume: "team-a_base", SourceSnapshot: "snap-1"},
		},
		"AHeldImageNamesNothingToMakeItOf": {
			image: wire.ImageRef{Name: "golden", UID: "img-5", Format: "qcow2", Held: true},
			want:  &driver.Image{UID: "img-5", Namespace: "team-a", Name: "golden", Format: "qcow2", Held: true},
		},
		"AllowedSourcesBecomePrefixes": {
			image: wire.ImageRef{Name: "ubuntu", UID: "img-3", URL: "http://10.1.2.3/u.qcow2", AllowedSources: []string{"10.0.0.0/8", "fd00::/8", "192.168.7.9/24"}},
			want: &driver.Image{UID: "img-3", Namespace: "team-a", Name: "ubuntu", URL: "http://10.1.2.3/u.qcow2", AllowedSources: []netip.Prefix{
				netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8"), netip.MustParsePrefix("192.168.7.0/24"),
			}},
		},
		"AMalformedAllowedSourceIsRefused": {
			image:   wire.ImageRef{Name: "ubuntu", UID: "img-3", URL: "http://10.1.2.3/u.qcow2", AllowedSources: []string{"10.0.0.0/8", "10.0.0.1"}},
			wantErr: `malformed intent: machine.disks[0].image.allowedSources[1] "10.0.0.1" is not a CIDR such as 10.0.0.0/8`,
		},
		"BothSourcesAreRefused": {
			image:   wire.ImageRef{Name: "golden", UID: "img-2", URL: "http://127.0.0.1/u.qcow2", SourceVolume: base},
			wantErr: "malformed intent: machine.disks[0].image needs a uid and one of a url, a sourceVolume, a sourceSnapshot, an externalName, a backup or held: set exactly one of url, sourceVolume, sourceSnapshot, externalName, backup or held, not more",
		},
		"NoSourceIsRefused": {
			image:   wire.ImageRef{Name: "golden", UID: "img-2"},
			wantErr: "malformed intent: machine.disks[0].image needs a uid and one of a url, a sourceVolume, a sourceSnapshot, an externalName, a backup or held: set exactly one of url, sourceVolume, sourceSnapshot, externalName, backup or held",
		},
		"NoUIDIsRefused": {
			image:   wire.ImageRef{Name: "golden", URL: "http://127.0.0.1/u.qcow2"},
			wantErr: "malformed intent: machine.disks[0].image needs a uid and one of a url, a sourceVolume, a sourceSnapshot, an externalName, a backup or held",
		},
		"ABackupKeepsWhereItIsAndWhichDisk": {
			image: wire.ImageRef{Name: "restored", UID: "img-4", Format: "raw", Backup: backup},
			want:  &driver.Image{UID: "img-4", Namespace: "team-a", Name: "restored", Format: "raw", Backup: backup},
		},
		"ABackupWithoutCredentialsIsRefused": {
			image: wire.ImageRef{Name: "restored", UID: "img-4", Format: "raw", Backup: &wire.ImageBackup{
				Location: wire.BackupLocation{Endpoint: "s3.example:9000", Bucket: "backups"}, Namespace: "team-a", ID: "b-1", Disk: "root",
			}},
			wantErr: "malformed intent: machine.disks[0].image needs a uid and one of a url, a sourceVolume, a sourceSnapshot, an externalName, a backup or held: location.credentials are required",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			in := wire.Intent{UID: "a", Namespace: "team-a", Name: "vm", Machine: wire.Machine{
				VCPU: 1, MemoryBytes: 1 << 20,
				Disks: []wire.Disk{{Name: "root", SizeBytes: 1 << 30, Image: &tc.image}},
			}}
			m, ok := machineOrRefused(t, in, tc.wantErr)
			if !ok {
				return
			}
			assert.Equal(t, tc.want, m.Disks[0].Image)
		})
	}
}

// TestMachineRefusesAVLANOutOfRange: a VLAN tag the 802.1Q header cannot
// carry is a malformed intent, not something a retry mends.
func TestMachineRefusesAVLANOutOfRange(t *testing.T) {
	for _, tc := range []struct {
		vlan    int32
		wantErr string
	}{
		{0, ""},
		{1, ""},
		{4094, ""},
		{4095, "malformed intent: machine.networks[0].vlan 4095 is not a VLAN id (0 to 4094)"},
		{-1, "malformed intent: machine.networks[0].vlan -1 is not a VLAN id (0 to 4094)"},
	} {
		t.Run(fmt.Sprint(tc.vlan), func(t *testing.T) {
			in := wire.Intent{UID: "a", Namespace: "team-a", Name: "vm", Machine: wire.Machine{
				VCPU: 1, MemoryBytes: 1 << 20,
				Disks:    []wire.Disk{{Name: "root", SizeBytes: 1 << 30}},
				Networks: []wire.Network{{Name: "lan", UID: "n-1", Mode: "bridge", Bridge: "br-site", VLAN: tc.vlan}},
			}}
			m, ok := machineOrRefused(t, in, tc.wantErr)
			if !ok {
				return
			}
			assert.Equal(t, tc.vlan, m.Networks[0].VLAN)
		})
	}
}

// TestNetworksHaveTheNodesNamesAndReportTheUsers: a VirtualNetwork's network
// on the node is the one it imports by external name or the one made for it,
// and the report names both by the VirtualNetwork.
func TestNetworksHaveTheNodesNamesAndReportTheUsers(t *testing.T) {
	in := wire.Intent{UID: "a", Namespace: "team-a", Name: "vm", Machine: wire.Machine{
		VCPU: 1, MemoryBytes: 1 << 20,
		Disks: []wire.Disk{{Name: "root", SizeBytes: 1 << 30}},
		Networks: []wire.Network{
			{Name: "own", CIDR: "10.1.0.0/24"},
			{Name: "lab", Mode: "nat", CIDR: "192.168.122.0/24", ExternalName: "default"},
		},
	}}
	m, err := machine(in)
	require.NoError(t, err)
	assert.Equal(t, []driver.Network{
		{Name: "team-a_own", CIDR: "10.1.0.0/24"},
		{Name: "default", Imported: true, Mode: driver.NetworkModeNAT, CIDR: "192.168.122.0/24"},
	}, m.Networks)

	r := report(in, driver.Observation{Phase: driver.PhaseRunning, Interfaces: []driver.Interface{
		{Network: "team-a_own", MAC: "52:54:00:00:00:01"}, {Network: "default", MAC: "52:54:00:00:00:02"},
	}})
	require.Len(t, r.Interfaces, 2)
	assert.Equal(t, "own", r.Interfaces[0].Network)
	assert.Equal(t, "lab", r.Interfaces[1].Network)
}

// TestImportedDisksHaveTheirVolumesName: a disk whose Volume imports a
// volume is that volume on the node, and can have no image to fill it.
func TestImportedDisksHaveTheirVolumesName(t *testing.T) {
	in := wire.Intent{UID: "a", Namespace: "team-a", Name: "vm", Machine: wire.Machine{
		VCPU: 1, MemoryBytes: 1 << 20,
		Disks: []wire.Disk{{Name: "root", SizeBytes: 1 << 30}, {Name: "data", SizeBytes: 3 << 30, ExternalName: "legacy.img"}},
	}}
	m, err := machine(in)
	require.NoError(t, err)
	assert.Equal(t, []driver.Disk{{Name: "team-a_root", SizeBytes: 1 << 30}, {Name: "legacy.img", SizeBytes: 3 << 30, Imported: true}}, m.Disks)

	in.Machine.Disks[1].Image = &wire.ImageRef{Name: "ubuntu", UID: "img-1", URL: "http://127.0.0.1/u.qcow2"}
	_, err = machine(in)
	require.Error(t, err)
	assert.True(t, driver.IsTerminal(err))
	assert.EqualError(t, err, `malformed intent: machine.disks[1] imports volume "legacy.img" and has an image to fill it from`)
}

// TestDisksKeepTheirSharedPool: a disk in a shared pool reaches the driver
// in that pool; one in none stays in the driver's default.
func TestDisksKeepTheirSharedPool(t *testing.T) {
	in := wire.Intent{UID: "a", Namespace: "team-a", Name: "vm", Machine: wire.Machine{
		VCPU: 1, MemoryBytes: 1 << 20,
		Disks: []wire.Disk{{Name: "root", SizeBytes: 1 << 30, Pool: "nfs-a"}, {Name: "scratch", SizeBytes: 1 << 30}},
	}}
	m, err := machine(in)
	require.NoError(t, err)
	assert.Equal(t, []driver.Disk{{Name: "team-a_root", SizeBytes: 1 << 30, Pool: "nfs-a"}, {Name: "team-a_scratch", SizeBytes: 1 << 30}}, m.Disks)
}

func TestWirePhaseKeepsKnownPhasesAndReportsOthersUnknown(t *testing.T) {
	for _, p := range driver.Phases {
		assert.Equal(t, string(p), string(wirePhase(p)), "a known phase keeps its name")
	}
	assert.Equal(t, wire.PhaseUnknown, wirePhase("Hibernating"), "a phase the protocol does not know")
}

// machineOrRefused is in's machine, and true; or, with wantErr set, checks
// that in is refused with exactly that error, never retried, and is false.
func machineOrRefused(t *testing.T, in wire.Intent, wantErr string) (driver.Machine, bool) {
	t.Helper()
	m, err := machine(in)
	if wantErr != "" {
		require.Error(t, err)
		assert.True(t, driver.IsTerminal(err), "not retried: %v", err)
		assert.EqualError(t, err, wantErr)
		return m, false
	}
	require.NoError(t, err)
	return m, true
}

// TestMachineCarriesThePowerRequests: what the hub asks of the running
// guest reaches the driver as it was asked.
func TestMachineCarriesThePowerRequests(t *testing.T) {
	in := wire.Intent{UID: "a", Namespace: "team-a", Name: "vm", Running: true, RestartNonce: "t1", Paused: true, ResetNonce: "r1", Machine: wire.Machine{
		VCPU: 1, MemoryBytes: 1 << 20,
		Disks: []wire.Disk{{Name: "root", SizeBytes: 1 << 30}},
	}}
	m, err := machine(in)
	require.NoError(t, err)
	assert.True(t, m.Running)
	assert.True(t, m.Paused)
	assert.Equal(t, "t1", m.RestartNonce)
	assert.Equal(t, "r1", m.ResetNonce)
}

// TestTheShapeAndItsMaximaTravelBothWays: the maxima the hub asks for
// reach the driver, and the shape the guest runs with, maxima included,
// reaches the report.
func TestTheShapeAndItsMaximaTravelBothWays(t *testing.T) {
	in := wire.Intent{UID: "a", Namespace: "team-a", Name: "vm", Running: true, Machine: wire.Machine{
		VCPU: 2, MaxVCPU: 6, MemoryBytes: 1 << 30, MaxMemoryBytes: 3 << 30,
		Disks: []wire.Disk{{Name: "root", SizeBytes: 1 << 30}},
	}}
	m, err := machine(in)
	require.NoError(t, err)
	assert.Equal(t, [4]int64{2, 6, 1 << 30, 3 << 30}, [4]int64{int64(m.VCPU), int64(m.MaxVCPU), m.MemoryBytes, m.MaxMemoryBytes})

	r := report(in, driver.Observation{VCPU: 3, MaxVCPU: 6, MemoryBytes: 2 << 30, MaxMemoryBytes: 3 << 30})
	assert.Equal(t, [4]int64{3, 6, 2 << 30, 3 << 30}, [4]int64{int64(r.VCPU), int64(r.MaxVCPU), r.MemoryBytes, r.MaxMemoryBytes})
}

// The disks a guest has are reported under the Volume names the intent
// gives them, the node's names (an imported volume's own) turned back; a
// disk no Volume of the intent names (one the guest still holds after
// its Volume left the spec) is left out rather than misnamed.
func TestTheAttachedDisksAreReportedByVolumeName(t *testing.T) {
	in := wire.Intent{UID: "a", Namespace: "team-a", Name: "vm", Running: true, Machine: wire.Machine{
		VCPU: 1, MemoryBytes: 1 << 30,
		Disks: []wire.Disk{{Name: "root", SizeBytes: 1 << 30}, {Name: "legacy", ExternalName: "legacy.img"}, {Name: "data", SizeBytes: 1 << 30}},
	}}
	m, err := machine(in)
	require.NoError(t, err)
	cases := map[string]struct {
		attached []string
		want     []string
	}{
		"EachDiskByItsVolume": {attached: []string{m.Disks[0].Name, m.Disks[1].Name, m.Disks[2].Name}, want: []string{"root", "legacy", "data"}},
		// The guest has not released a disk whose Volume left the intent.
		"ADetachingDiskStaysInItsPlace":    {attached: []string{m.Disks[0].Name, "team-a_gone", m.Disks[2].Name}, want: []string{"root", "gone", "data"}},
		"ADiskOfAnotherNamespaceIsLeftOut": {attached: []string{m.Disks[0].Name, "team-b_gone", m.Disks[2].Name}, want: []string{"root", "data"}},
		"ADiskNoVolumeNameMadeIsLeftOut":   {attached: []string{m.Disks[0].Name, "other.img", "team-a_Bad", m.Disks[2].Name}, want: []string{"root", "data"}},
		"TheDriversOrderIsKept":            {attached: []string{m.Disks[0].Name, m.Disks[2].Name, "team-a_gone", m.Disks[1].Name}, want: []string{"root", "data", "gone", "legacy"}},
		"ADriverThatDoesNotTellSaysNil":    {},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			assert.Equal(t, tc.want, report(in, driver.Observation{Disks: tc.attached}).Disks)
		})
	}
}

// TestMachineNamesItsInstancetype: the revision of the instance type the
// shape came from reaches the driver, a malformed one is refused naming
// the field, and an intent without one gives a Machine without one.
func TestMachineNamesItsInstancetype(t *testing.T) {
	cases := map[string]struct {
		it      *wire.InstancetypeRevision
		want    *driver.Instancetype
		wantErr bool
	}{
		"None":        {},
		"Cluster":     {it: &wire.InstancetypeRevision{Kind: wire.ClusterInstancetypeKind, Name: "u1.small", Revision: 3}, want: &driver.Instancetype{Cluster: true, Name: "u1.small", Revision: 3}},
		"Namespaced":  {it: &wire.InstancetypeRevision{Kind: wire.InstancetypeKind, Name: "small", Revision: 1}, want: &driver.Instancetype{Name: "small", Revision: 1}},
		"UnknownKind": {it: &wire.InstancetypeRevision{Kind: "Flavor", Name: "small", Revision: 1}, wantErr: true},
		"NoRevision":  {it: &wire.InstancetypeRevision{Kind: wire.InstancetypeKind, Name: "small"}, wantErr: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			in := wire.Intent{UID: "a", Namespace: "team-a", Name: "vm", Machine: wire.Machine{
				VCPU: 1, MemoryBytes: 1 << 20, Instancetype: tc.it,
				Disks: []wire.Disk{{Name: "root", SizeBytes: 1 << 30}},
			}}
			m, err := machine(in)
			if tc.wantErr {
				require.ErrorContains(t, err, "machine.instancetype")
				assert.True(t, driver.IsTerminal(err))
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, m.Instancetype)
		})
	}
}
