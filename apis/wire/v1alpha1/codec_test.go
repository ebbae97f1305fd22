package v1alpha1

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return b
}

// withField returns the JSON of v with one top-level field set to value.
func withField(t *testing.T, v any, field string, value any) []byte {
	t.Helper()
	m := map[string]any{}
	require.NoError(t, json.Unmarshal(mustJSON(t, v), &m))
	m[field] = value
	return mustJSON(t, m)
}

func TestDecodeIntent(t *testing.T) {
	cases := map[string]struct {
		in      []byte
		want    Intent
		wantErr any
	}{
		"RoundTripsARealIntent":        {in: mustJSON(t, exampleIntent()), want: exampleIntent()},
		"IgnoresFieldsFromTheFuture":   {in: withField(t, exampleIntent(), "gpu", map[string]int{"count": 1}), want: exampleIntent()},
		"RefusesANewerProtocolVersion": {in: withField(t, exampleIntent(), "protocolVersion", ProtocolVersion+1), wantErr: &VersionError{}},
		"RefusesANewerVersionEvenIfFieldsChangedType": {
			in: []byte(`{"protocolVersion":2,"generation":"three"}`), wantErr: &VersionError{},
		},
		"RefusesAMissingProtocolVersion": {in: []byte(`{"uid":"a"}`), wantErr: &VersionError{}},
		"RefusesMalformedJSON":           {in: []byte(`{"protocolVersion":1,`), wantErr: &DecodeError{}},
		"RefusesAWrongFieldType":         {in: withField(t, exampleIntent(), "generation", "three"), wantErr: &DecodeError{}},
		"RefusesAUIDThatIsNotAKeyToken":  {in: withField(t, exampleIntent(), "uid", "a.b"), wantErr: &KeyError{}},
		"RefusesNegativeMemory": {
			in: []byte(`{"protocolVersion":1,"uid":"a","machine":{"memoryBytes":-1}}`), wantErr: &DecodeError{},
		},
		"RoundTripsAClonedImage":    {in: mustJSON(t, exampleClonedIntent()), want: exampleClonedIntent()},
		"RoundTripsAPauseAndAReset": {in: mustJSON(t, pausedAndReset(exampleIntent())), want: pausedAndReset(exampleIntent())},
		"ReadsPausedAndResetNonceByTheirWireNames": {
			in:   []byte(`{"protocolVersion":1,"uid":"a","running":true,"paused":true,"resetNonce":"r1"}`),
			want: Intent{ProtocolVersion: 1, UID: "a", Running: true, Paused: true, ResetNonce: "r1"},
		},
		"RefusesAnImageWithBothURLAndSourceVolume": {
			in: mustJSON(t, withImage(exampleIntent(), func(r *ImageRef) { r.SourceVolume = exampleClonedIntent().Machine.Disks[0].Image.SourceVolume })), wantErr: &DecodeError{},
		},
		"RefusesAnImageWithNeitherURLNorSourceVolume": {
			in: mustJSON(t, withImage(exampleIntent(), func(r *ImageRef) { r.URL = "" })), wantErr: &DecodeError{},
		},
		"RefusesASourceVolumeWithoutAUID": {
			in: mustJSON(t, withImage(exampleClonedIntent(), func(r *ImageRef) { r.SourceVolume.UID = "" })), wantErr: &DecodeError{},
		},
		"RefusesAChecksumOnAClone": {
			in: mustJSON(t, withImage(exampleClonedIntent(), func(r *ImageRef) { r.Checksum = "ab" })), wantErr: &DecodeError{},
		},
		"RoundTripsADiskInASharedPool": {in: mustJSON(t, inPool(exampleIntent(), "nfs-a")), want: inPool(exampleIntent(), "nfs-a")},
		"RoundTripsAnInstancetype":     {in: mustJSON(t, typedIntent()), want: typedIntent()},
		"RefusesADiskPoolThatIsNotAToken": {
			in: mustJSON(t, inPool(exampleIntent(), "../etc")), wantErr: &KeyError{},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := DecodeIntent(tc.in)
			if tc.wantErr != nil {
				require.ErrorAs(t, err, &tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestDecodeReportAndHeartbeat(t *testing.T) {
	cases := map[string]struct {
		decode  func([]byte) (any, error)
		in      []byte
		want    any
		wantErr any
	}{
		"ReportRoundTrips":          {decode: decodeReport, in: mustJSON(t, exampleReport()), want: exampleReport()},
		"ReportRefusesNewer":        {decode: decodeReport, in: withField(t, exampleReport(), "protocolVersion", 99), wantErr: &VersionError{}},
		"ReportRefusesNoNode":       {decode: decodeReport, in: withField(t, exampleReport(), "node", ""), wantErr: &KeyError{}},
		"ReportRoundTripsPaused":    {decode: decodeReport, in: withField(t, exampleReport(), "phase", "Paused"), want: withPhase(exampleReport(), PhasePaused)},
		"HeartbeatRoundTrips":       {decode: decodeHeartbeat, in: mustJSON(t, exampleHeartbeat()), want: exampleHeartbeat()},
		"HeartbeatIgnoresUnknowns":  {decode: decodeHeartbeat, in: withField(t, exampleHeartbeat(), "gpus", 4), want: exampleHeartbeat()},
		"HeartbeatRefusesNewer":     {decode: decodeHeartbeat, in: withField(t, exampleHeartbeat(), "protocolVersion", 2), wantErr: &VersionError{}},
		"HeartbeatRefusesNoNode":    {decode: decodeHeartbeat, in: withField(t, exampleHeartbeat(), "node", ""), wantErr: &KeyError{}},
		"HeartbeatRoundTripsALease": {decode: decodeHeartbeat, in: mustJSON(t, withLease(exampleHeartbeat())), want: withLease(exampleHeartbeat())},
		"HeartbeatRefusesANegativeLease": {
			decode: decodeHeartbeat, in: withField(t, exampleHeartbeat(), "fenceAfterMillis", -1), wantErr: &DecodeError{},
		},
		"HeartbeatRefusesASharedPoolThatIsNotAToken": {
			decode: decodeHeartbeat, in: withField(t, exampleHeartbeat(), "sharedPools", []string{"nfs-a", "nfs b"}), wantErr: &KeyError{},
		},
		"HeartbeatRefusesAnEmptySharedPool": {
			decode: decodeHeartbeat, in: withField(t, exampleHeartbeat(), "sharedPools", []string{""}), wantErr: &KeyError{},
		},

		"VolumeIntentRoundTrips":        {decode: decodeVolumeIntent, in: mustJSON(t, exampleVolumeIntent()), want: exampleVolumeIntent()},
		"VolumeIntentIgnoresUnknowns":   {decode: decodeVolumeIntent, in: withField(t, exampleVolumeIntent(), "snapshot", true), want: exampleVolumeIntent()},
		"VolumeIntentRefusesNewer":      {decode: decodeVolumeIntent, in: withField(t, exampleVolumeIntent(), "protocolVersion", 2), wantErr: &VersionError{}},
		"VolumeIntentRefusesUnsafeUID":  {decode: decodeVolumeIntent, in: withField(t, exampleVolumeIntent(), "uid", "a.>"), wantErr: &KeyError{}},
		"VolumeIntentRefusesNoDisk":     {decode: decodeVolumeIntent, in: withField(t, exampleVolumeIntent(), "disk", ""), wantErr: &DecodeError{}},
		"VolumeIntentRoundTripsAPool":   {decode: decodeVolumeIntent, in: withField(t, exampleVolumeIntent(), "pool", "nfs-a"), want: withVolumePool(exampleVolumeIntent(), "nfs-a")},
		"VolumeIntentRefusesUnsafePool": {decode: decodeVolumeIntent, in: withField(t, exampleVolumeIntent(), "pool", "nfs/a"), wantErr: &KeyError{}},
		"VolumeIntentRefusesPresent":    {decode: decodeVolumeIntent, in: withField(t, exampleVolumeIntent(), "absent", false), wantErr: &DecodeError{}},
		"ImportIntentRoundTrips":        {decode: decodeVolumeIntent, in: mustJSON(t, exampleImportIntent()), want: exampleImportIntent()},
		"ImportIntentDeletes":           {decode: decodeVolumeIntent, in: withField(t, exampleImportIntent(), "absent", true), want: withAbsent(exampleImportIntent())},
		"ImportIntentRefusesOtherDisk":  {decode: decodeVolumeIntent, in: withField(t, exampleImportIntent(), "disk", "team-a_legacy"), wantErr: &DecodeError{}},
		"ImportReportRoundTrips":        {decode: decodeVolumeReport, in: mustJSON(t, exampleImportReport()), want: exampleImportReport()},
		"VolumeIntentRefusesMalformed":  {decode: decodeVolumeIntent, in: []byte(`{"protocolVersion":1,"absent":"yes"}`), wantErr: &DecodeError{}},
		"VolumeReportRoundTrips":        {decode: decodeVolumeReport, in: mustJSON(t, exampleVolumeReport()), want: exampleVolumeReport()},
		"VolumeReportRefusesNewer":      {decode: decodeVolumeReport, in: withField(t, exampleVolumeReport(), "protocolVersion", 2), wantErr: &VersionError{}},
		"VolumeReportRefusesMissingUID": {decode: decodeVolumeReport, in: withField(t, exampleVolumeReport(), "uid", ""), wantErr: &KeyError{}},
		"VolumeReportRefusesNoVersion":  {decode: decodeVolumeReport, in: []byte(`{"uid":"a","gone":true}`), wantErr: &VersionError{}},

		"ImageReportRoundTrips":            {decode: decodeImageReport, in: mustJSON(t, exampleImageReport()), want: exampleImageReport()},
		"ImageReportIgnoresUnknowns":       {decode: decodeImageReport, in: withField(t, exampleImageReport(), "checksum", "ab"), want: exampleImageReport()},
		"ImageReportRefusesNewer":          {decode: decodeImageReport, in: withField(t, exampleImageReport(), "protocolVersion", 2), wantErr: &VersionError{}},
		"ImageReportRefusesNoVersion":      {decode: decodeImageReport, in: []byte(`{"uid":"a","node":"n","phase":"Ready"}`), wantErr: &VersionError{}},
		"ImageReportRefusesUnsafeUID":      {decode: decodeImageReport, in: withField(t, exampleImageReport(), "uid", "img.>"), wantErr: &KeyError{}},
		"ImageReportRefusesNoNode":         {decode: decodeImageReport, in: withField(t, exampleImageReport(), "node", ""), wantErr: &KeyError{}},
		"ImageReportRefusesUnknownPhase":   {decode: decodeImageReport, in: withField(t, exampleImageReport(), "phase", "Pruning"), wantErr: &DecodeError{}},
		"ImageReportRefusesMissingPhase":   {decode: decodeImageReport, in: withField(t, exampleImageReport(), "phase", ""), wantErr: &DecodeError{}},
		"ImageReportRefusesNegativeSize":   {decode: decodeImageReport, in: withField(t, exampleImageReport(), "sizeBytes", -1), wantErr: &DecodeError{}},
		"ImageReportRefusesAWrongSizeType": {decode: decodeImageReport, in: withField(t, exampleImageReport(), "sizeBytes", "1Gi"), wantErr: &DecodeError{}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := tc.decode(tc.in)
			if tc.wantErr != nil {
				require.ErrorAs(t, err, &tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

// withImage changes a copy of the image of in's first disk.
func withImage(in Intent, change func(*ImageRef)) Intent {
	disks := append([]Disk(nil), in.Machine.Disks...)
	img := *disks[0].Image
	if img.SourceVolume != nil {
		src := *img.SourceVolume
		img.SourceVolume = &src
	}
	change(&img)
	disks[0].Image = &img
	in.Machine.Disks = disks
	return in
}

func TestImageRefNamesWhatIsWrong(t *testing.T) {
	cases := map[string]struct {
		ref     ImageRef
		wantErr string
	}{
		"ADownload":               {ref: ImageRef{UID: "i", URL: "https://x/i.qcow2", Checksum: "ab"}},
		"AClone":                  {ref: ImageRef{UID: "i", SourceVolume: &SourceVolume{Name: "base", UID: "v"}}},
		"AnImport":                {ref: ImageRef{UID: "i", ExternalName: "debian-12"}},
		"AHeldImage":              {ref: ImageRef{UID: "i", Held: true}},
		"AHeldImageAndAClone":     {ref: ImageRef{UID: "i", Held: true, SourceVolume: &SourceVolume{Name: "base", UID: "v"}}, wantErr: "set exactly one of url, sourceVolume, sourceSnapshot, externalName, backup or held, not more"},
		"Both":                    {ref: ImageRef{UID: "i", URL: "https://x/i.qcow2", SourceVolume: &SourceVolume{Name: "base", UID: "v"}}, wantErr: "set exactly one of url, sourceVolume, sourceSnapshot, externalName, backup or held, not more"},
		"URLAndImport":            {ref: ImageRef{UID: "i", URL: "https://x/i.qcow2", ExternalName: "debian-12"}, wantErr: "set exactly one of url, sourceVolume, sourceSnapshot, externalName, backup or held, not more"},
		"Neither":                 {ref: ImageRef{UID: "i"}, wantErr: "set exactly one of url, sourceVolume, sourceSnapshot, externalName, backup or held"},
		"AnImportChecksum":        {ref: ImageRef{UID: "i", ExternalName: "debian-12", Checksum: "ab"}, wantErr: "checksum verifies a download and goes with url"},
		"ACloneNoName":            {ref: ImageRef{UID: "i", SourceVolume: &SourceVolume{UID: "v"}}, wantErr: "sourceVolume needs a name and a uid"},
		"ASnapshotCopy":           {ref: ImageRef{UID: "i", SourceSnapshot: &SourceSnapshot{Volume: SourceVolume{Name: "base", UID: "v"}, Snapshot: "s"}}},
		"ASnapshotCopyNoSnapshot": {ref: ImageRef{UID: "i", SourceSnapshot: &SourceSnapshot{Volume: SourceVolume{Name: "base", UID: "v"}}}, wantErr: `invalid sourceSnapshot.snapshot "": must not be empty`},
		// A snapshot name smuggling another option into qemu-img's -l.
		"ASnapshotCopyOfAnOption": {ref: ImageRef{UID: "i", SourceSnapshot: &SourceSnapshot{Volume: SourceVolume{Name: "base", UID: "v"}, Snapshot: "s,file.filename=/etc/shadow"}}, wantErr: `invalid sourceSnapshot.snapshot "s,file.filename=/etc/shadow": contains ','; only letters, digits, '-' and '_' are allowed`},
		"ASnapshotCopyAndAClone":  {ref: ImageRef{UID: "i", SourceVolume: &SourceVolume{Name: "base", UID: "v"}, SourceSnapshot: &SourceSnapshot{Volume: SourceVolume{Name: "base", UID: "v"}, Snapshot: "s"}}, wantErr: "set exactly one of url, sourceVolume, sourceSnapshot, externalName, backup or held, not more"},
		"ACloneChecksum":          {ref: ImageRef{UID: "i", Checksum: "ab", SourceVolume: &SourceVolume{Name: "base", UID: "v"}}, wantErr: "checksum verifies a download and goes with url"},
		"ABackup":                 {ref: ImageRef{UID: "i", Backup: imageBackup(func(*ImageBackup) {})}},
		"ABackupAndURL":           {ref: ImageRef{UID: "i", URL: "https://x/i.qcow2", Backup: imageBackup(func(*ImageBackup) {})}, wantErr: "set exactly one of url, sourceVolume, sourceSnapshot, externalName, backup or held, not more"},
		"ABackupNoID":             {ref: ImageRef{UID: "i", Backup: imageBackup(func(b *ImageBackup) { b.ID = "" })}, wantErr: `invalid backup.id "": must not be empty`},
		"ABackupOfAPath":          {ref: ImageRef{UID: "i", Backup: imageBackup(func(b *ImageBackup) { b.Namespace = "../other" })}, wantErr: `invalid backup.namespace "../other": contains '.'; only letters, digits, '-' and '_' are allowed`},
		"ABackupNoCreds":          {ref: ImageRef{UID: "i", Backup: imageBackup(func(b *ImageBackup) { b.Location.Credentials = BackupCredentials{} })}, wantErr: "location.credentials are required"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			err := tc.ref.Validate()
			if tc.wantErr == "" {
				assert.NoError(t, err)
				return
			}
			assert.EqualError(t, err, tc.wantErr)
		})
	}

	_, err := EncodeIntent(withImage(exampleClonedIntent(), func(r *ImageRef) { r.URL = "https://x/i.qcow2" }))
	assert.EqualError(t, err, "cannot decode intent: machine.disks[0].image: set exactly one of url, sourceVolume, sourceSnapshot, externalName, backup or held, not more",
		"an image with two sources must not be written")
}

// inPool is in with its first disk in the shared pool p.
func inPool(in Intent, p string) Intent {
	disks := append([]Disk(nil), in.Machine.Disks...)
	disks[0].Pool = p
	in.Machine.Disks = disks
	return in
}

// withLease is h announcing a lease and shared pools.
func withLease(h NodeHeartbeat) NodeHeartbeat {
	h.FenceAfterMillis, h.SharedPools = 20000, []string{"nfs-a", "ceph_b"}
	return h
}

func withVolumePool(v VolumeIntent, p string) VolumeIntent {
	v.Pool = p
	return v
}

// pausedAndReset is in asking for its guest paused and reset.
func pausedAndReset(in Intent) Intent {
	in.Paused, in.ResetNonce = true, "2026-11-03T10:01:00Z"
	return in
}

func withPhase(r Report, p Phase) Report {
	r.Phase = p
	return r
}

func decodeReport(b []byte) (any, error)    { return DecodeReport(b) }
func decodeHeartbeat(b []byte) (any, error) { return DecodeNodeHeartbeat(b) }
func withAbsent(v VolumeIntent) VolumeIntent {
	v.Absent = true
	return v
}

func decodeVolumeIntent(b []byte) (any, error) { return DecodeVolumeIntent(b) }
func decodeVolumeReport(b []byte) (any, error) { return DecodeVolumeReport(b) }
func decodeImageReport(b []byte) (any, error)  { return DecodeImageReport(b) }

func TestEncodeStampsTheVersionAndValidates(t *testing.T) {
	in := exampleIntent()
	in.ProtocolVersion = 0
	b, err := EncodeIntent(in)
	require.NoError(t, err)
	got, err := DecodeIntent(b)
	require.NoError(t, err)
	assert.Equal(t, ProtocolVersion, got.ProtocolVersion)

	r := exampleReport()
	r.Node = ""
	_, err = EncodeReport(r)
	var ke *KeyError
	assert.ErrorAs(t, err, &ke, "a report for no node must not be written")
	r.Node = "node-1.rack-a.example.com"
	_, err = EncodeReport(r)
	assert.NoError(t, err, "a report carries its node's real name, dots and all")

	vi := exampleVolumeIntent()
	vi.ProtocolVersion = 0
	b, err = EncodeVolumeIntent(vi)
	require.NoError(t, err)
	gotVI, err := DecodeVolumeIntent(b)
	require.NoError(t, err)
	assert.Equal(t, exampleVolumeIntent(), gotVI)

	vi.Absent = false
	_, err = EncodeVolumeIntent(vi)
	var de *DecodeError
	assert.ErrorAs(t, err, &de, "a present volume intent is reserved and must not be written")

	_, err = EncodeVolumeReport(VolumeReport{UID: "a*"})
	assert.ErrorAs(t, err, &ke)

	ir := exampleImageReport()
	ir.ProtocolVersion = 0
	b, err = EncodeImageReport(ir)
	require.NoError(t, err)
	gotIR, err := DecodeImageReport(b)
	require.NoError(t, err)
	assert.Equal(t, exampleImageReport(), gotIR)

	ir.Phase = "Pruned"
	_, err = EncodeImageReport(ir)
	assert.ErrorAs(t, err, &de, "a phase this version does not define must not be written")
	ir.Phase, ir.Node = ImagePhaseReady, string(make([]byte, MaxNodeNameLen+1))
	_, err = EncodeImageReport(ir)
	assert.ErrorAs(t, err, &ke, "an image report for a name no node has must not be written")
}

func TestVersionErrorTellsTheReaderToUpgrade(t *testing.T) {
	_, err := DecodeIntent([]byte(`{"protocolVersion":7}`))
	assert.EqualError(t, err, "intent has protocolVersion 7 but this reader understands up to 1; upgrade it")
}

func TestDecodeFabric(t *testing.T) {
	cases := map[string]struct {
		in      []byte
		want    Fabric
		wantErr any
	}{
		"RoundTripsPeers":              {in: mustJSON(t, Fabric{ProtocolVersion: 1, Peers: []string{"192.0.2.1", "2001:db8::1"}}), want: Fabric{ProtocolVersion: 1, Peers: []string{"192.0.2.1", "2001:db8::1"}}},
		"AcceptsNoPeers":               {in: []byte(`{"protocolVersion":1}`), want: Fabric{ProtocolVersion: 1}},
		"RefusesAPeerThatIsNoAddress":  {in: []byte(`{"protocolVersion":1,"peers":["192.0.2.1","evil.example"]}`), wantErr: &DecodeError{}},
		"RefusesANewerProtocolVersion": {in: []byte(`{"protocolVersion":2}`), wantErr: &VersionError{}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := DecodeFabric(tc.in)
			if tc.wantErr != nil {
				require.ErrorAs(t, err, &tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestPoolErrorsNameTheField(t *testing.T) {
	_, err := EncodeIntent(inPool(exampleIntent(), "a.b"))
	assert.EqualError(t, err, `invalid machine.disks[0].pool "a.b": contains '.'; only letters, digits, '-' and '_' are allowed`)

	h := exampleHeartbeat()
	h.SharedPools = []string{"nfs-a", "nfs*"}
	_, err = EncodeNodeHeartbeat(h)
	assert.EqualError(t, err, `invalid sharedPools[1] "nfs*": contains '*'; only letters, digits, '-' and '_' are allowed`)

	h.SharedPools, h.FenceAfterMillis = nil, -5
	_, err = EncodeNodeHeartbeat(h)
	assert.EqualError(t, err, "cannot decode node heartbeat: fenceAfterMillis must not be negative, got -5")
}

// imageBackup is a valid ImageBackup as edit changes it.
func imageBackup(edit func(*ImageBackup)) *ImageBackup {
	b := &ImageBackup{Namespace: "team-a", ID: "b1", Disk: "root", Location: validBackupIntent().Location}
	edit(b)
	return b
}

func typedIntent() Intent {
	in := exampleIntent()
	in.Machine.Instancetype = &InstancetypeRevision{Kind: ClusterInstancetypeKind, Name: "u1.small", Revision: 2}
	return in
}

// TestAnUntypedIntentIsEncodedAsBefore: the instance type is left out of
// an intent without one, so such intents are the bytes they were before
// the field existed (nothing is republished for it), and an agent that
// predates it reads a typed one as the shape alone (see
// IgnoresFieldsFromTheFuture).
func TestAnUntypedIntentIsEncodedAsBefore(t *testing.T) {
	m := map[string]any{}
	require.NoError(t, json.Unmarshal(mustJSON(t, exampleIntent().Machine), &m))
	assert.NotContains(t, m, "instancetype")
	require.NoError(t, json.Unmarshal(mustJSON(t, typedIntent().Machine), &m))
	assert.Equal(t, map[string]any{"kind": ClusterInstancetypeKind, "name": "u1.small", "revision": float64(2)}, m["instancetype"])
}
