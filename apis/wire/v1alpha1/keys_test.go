package v1alpha1

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestKindKey(t *testing.T) {
	guest := testKind{GuestIntents.Name, GuestIntents.Key, GuestIntents.UID, GuestIntents.Bucket}
	volume := testKind{VolumeReports.Name, VolumeReports.Key, VolumeReports.UID, VolumeReports.Bucket}
	image := testKind{ImageReports.Name, ImageReports.Key, ImageReports.UID, ImageReports.Bucket}
	cases := map[string]struct {
		kind      testKind
		node, uid string
		want      string
		wantErr   bool
	}{
		"AGuestKeyJoinsNodeAndUID":       {kind: guest, node: "node1", uid: "6f1c2d9e-0b7a", want: "node1.6f1c2d9e-0b7a"},
		"ADottedNodeNameIsOneToken":      {kind: guest, node: "node-1.rack-a.example.com", uid: "u", want: "node-1_rack-a_example_com.u"},
		"AStarInANodeNameIsEscaped":      {kind: guest, node: "*", uid: "u", want: "_CK.u"},
		"ASpaceInANodeNameIsEscaped":     {kind: guest, node: "node 1", uid: "u", want: "node_CA1.u"},
		"RefusesAFullWildcardUID":        {kind: guest, node: "node1", uid: ">", wantErr: true},
		"RefusesAnEmptyNode":             {kind: guest, node: "", uid: "u", wantErr: true},
		"RefusesAnEmptyUID":              {kind: guest, node: "node1", uid: "", wantErr: true},
		"RefusesAnOverlongNodeName":      {kind: guest, node: string(make([]byte, MaxNodeNameLen+1)), uid: "u", wantErr: true},
		"AGuestUIDNeverHoldsAToken":      {kind: guest, node: "node1", uid: "volume.u", wantErr: true},
		"AVolumeKeyNestsUnderTheNode":    {kind: volume, node: "node1", uid: "vol-1", want: "node1.volume.vol-1"},
		"AVolumeKeyEscapesAWildcardNode": {kind: volume, node: ">", uid: "u", want: "_DO.volume.u"},
		"AVolumeKeyRefusesADottedUID":    {kind: volume, node: "node1", uid: "a.b", wantErr: true},
		"AVolumeKeyRefusesAWildcardUID":  {kind: volume, node: "node1", uid: "*", wantErr: true},
		"AnImageKeyNestsUnderTheNode":    {kind: image, node: "node1.example.com", uid: "img-1", want: "node1_example_com.image.img-1"},
		"AnImageKeyRefusesAnEmptyUID":    {kind: image, node: "node1", uid: "", wantErr: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := tc.kind.key(tc.node, tc.uid)
			if tc.wantErr {
				var ke *KeyError
				require.ErrorAs(t, err, &ke)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
			node, rest, err := ParseKey(got)
			require.NoError(t, err)
			assert.Equal(t, tc.node, node)
			uid, ok := tc.kind.uidOf(rest)
			assert.True(t, ok, "the kind recognises its own key")
			assert.Equal(t, tc.uid, uid)
		})
	}
}

// TestKindUID pins which rest of a per-node key each kind takes as its own.
func TestKindUID(t *testing.T) {
	uidOf := map[string]func(string) (string, bool){
		"guest": GuestReports.UID, "volume": VolumeReports.UID, "image": ImageReports.UID, "fabric": Fabrics.UID,
	}
	cases := map[string]struct {
		kind, rest string
		uid        string
		ok         bool
	}{
		"AGuestUID":                     {kind: "guest", rest: "6f1c2d9e-0b7a", uid: "6f1c2d9e-0b7a", ok: true},
		"AVolumeKeyIsNoGuest":           {kind: "guest", rest: "volume.vol-1"},
		"AVolumeKey":                    {kind: "volume", rest: "volume.vol-1", uid: "vol-1", ok: true},
		"AGuestUIDIsNotAVolume":         {kind: "volume", rest: "6f1c2d9e-0b7a"},
		"AGuestNamedVolumeIsNotAVolume": {kind: "volume", rest: "volume"},
		"AnotherKindIsNotAVolume":       {kind: "volume", rest: "network.net-1"},
		"ADeeperKeyIsNotAVolume":        {kind: "volume", rest: "volume.a.b"},
		"AnEmptyUIDIsNotAVolume":        {kind: "volume", rest: "volume."},
		"AnImageKey":                    {kind: "image", rest: "image.img-1", uid: "img-1", ok: true},
		"AVolumeKeyIsNotAnImage":        {kind: "image", rest: "volume.img-1"},
		"AGuestNamedImageIsNotAnImage":  {kind: "image", rest: "image"},
		"TheFabricKey":                  {kind: "fabric", rest: "fabric.peers", uid: FabricUID, ok: true},
		"AGuestNamedFabricIsNoFabric":   {kind: "fabric", rest: "fabric"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			uid, ok := uidOf[tc.kind](tc.rest)
			assert.Equal(t, tc.ok, ok)
			assert.Equal(t, tc.uid, uid)
		})
	}
}

func TestParseKey(t *testing.T) {
	cases := map[string]struct {
		key        string
		node, rest string
		wantErr    bool
	}{
		"SplitsAGuestKey":               {key: "node1.abc", node: "node1", rest: "abc"},
		"KeepsOtherPerNodeIntentsWhole": {key: "node1.volume.abc", node: "node1", rest: "volume.abc"},
		"RefusesAKeyWithoutANode":       {key: "node1", wantErr: true},
		"RefusesAnEmptyToken":           {key: "node1..abc", wantErr: true},
		"RefusesAWildcardToken":         {key: "node1.*", wantErr: true},
		"ReadsTheNodesRealName":         {key: "node-1_rack-a.abc", node: "node-1.rack-a", rest: "abc"},
		"RefusesANodeTokenNoNameHas":    {key: "Node1.abc", wantErr: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			node, rest, err := ParseKey(tc.key)
			if tc.wantErr {
				var ke *KeyError
				require.ErrorAs(t, err, &ke)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, []string{tc.node, tc.rest}, []string{node, rest})
		})
	}
}

func TestSubjectAndStreamMatchJetStreamKV(t *testing.T) {
	assert.Equal(t, "$KV.intents.node1.abc", Subject(BucketIntents, "node1.abc"))
	assert.Equal(t, "KV_nodes", Stream(BucketNodes))
}
