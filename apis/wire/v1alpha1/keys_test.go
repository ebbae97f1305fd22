package v1alpha1

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestIntentKey(t *testing.T) {
	cases := map[string]struct {
		node, uid string
		want      string
		wantErr   bool
	}{
		"JoinsNodeAndUID":            {node: "node1", uid: "6f1c2d9e-0b7a", want: "node1.6f1c2d9e-0b7a"},
		"ADottedNodeNameIsOneToken":  {node: "node-1.rack-a.example.com", uid: "u", want: "node-1_rack-a_example_com.u"},
		"AStarInANodeNameIsEscaped":  {node: "*", uid: "u", want: "_CK.u"},
		"RefusesAFullWildcardUID":    {node: "node1", uid: ">", wantErr: true},
		"ASpaceInANodeNameIsEscaped": {node: "node 1", uid: "u", want: "node_CA1.u"},
		"RefusesAnEmptyNode":         {node: "", uid: "u", wantErr: true},
		"RefusesAnEmptyUID":          {node: "node1", uid: "", wantErr: true},
		"RefusesAnOverlongNodeName":  {node: string(make([]byte, MaxNodeNameLen+1)), uid: "u", wantErr: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := IntentKey(tc.node, tc.uid)
			if tc.wantErr {
				var ke *KeyError
				require.ErrorAs(t, err, &ke)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestVolumeKeys(t *testing.T) {
	cases := map[string]struct {
		key     func(node, uid string) (string, error)
		node    string
		uid     string
		want    string
		wantErr bool
	}{
		"IntentKeyNestsUnderTheNode":      {key: VolumeIntentKey, node: "node1", uid: "vol-1", want: "node1.volume.vol-1"},
		"ReportKeyNestsUnderTheNode":      {key: VolumeReportKey, node: "node1", uid: "vol-1", want: "node1.volume.vol-1"},
		"IntentKeyRefusesADottedUID":      {key: VolumeIntentKey, node: "node1", uid: "a.b", wantErr: true},
		"ReportKeyRefusesAWildcardUID":    {key: VolumeReportKey, node: "node1", uid: "*", wantErr: true},
		"IntentKeyEscapesAWildcardNode":   {key: VolumeIntentKey, node: ">", uid: "u", want: "_DO.volume.u"},
		"GuestIntentKeyStillRefusesADot":  {key: IntentKey, node: "node1", uid: "volume.u", wantErr: true},
		"GuestReportKeyStillRefusesEmpty": {key: ReportKey, node: "node1", uid: "", wantErr: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := tc.key(tc.node, tc.uid)
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
			uid, ok := ParseVolumeKey(rest)
			assert.True(t, ok)
			assert.Equal(t, tc.uid, uid)
		})
	}
}

func TestParseVolumeKey(t *testing.T) {
	cases := map[string]struct {
		rest string
		uid  string
		ok   bool
	}{
		"AVolumeKey":                    {rest: "volume.vol-1", uid: "vol-1", ok: true},
		"AGuestUIDIsNotAVolume":         {rest: "6f1c2d9e-0b7a"},
		"AGuestNamedVolumeIsNotAVolume": {rest: "volume"},
		"AnotherKindIsNotAVolume":       {rest: "network.net-1"},
		"ADeeperKeyIsNotAVolume":        {rest: "volume.a.b"},
		"AnEmptyUIDIsNotAVolume":        {rest: "volume."},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			uid, ok := ParseVolumeKey(tc.rest)
			assert.Equal(t, tc.ok, ok)
			assert.Equal(t, tc.uid, uid)
		})
	}
}

func TestImageKeys(t *testing.T) {
	cases := map[string]struct {
		node, uid string
		want      string
		wantErr   bool
	}{
		"NestsUnderTheNode":    {node: "node1", uid: "img-1", want: "node1.image.img-1"},
		"RefusesADottedUID":    {node: "node1", uid: "a.b", wantErr: true},
		"RefusesAWildcardUID":  {node: "node1", uid: "*", wantErr: true},
		"EscapesAWildcardNode": {node: ">", uid: "img-1", want: "_DO.image.img-1"},
		"RefusesAnEmptyUID":    {node: "node1", uid: "", wantErr: true},
		"TakesADottedNodeName": {node: "node1.example.com", uid: "img-1", want: "node1_example_com.image.img-1"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := ImageReportKey(tc.node, tc.uid)
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
			uid, ok := ParseImageKey(rest)
			assert.True(t, ok)
			assert.Equal(t, tc.uid, uid)
			_, isVolume := ParseVolumeKey(rest)
			assert.False(t, isVolume, "an image key is not a volume key")
		})
	}
}

func TestParseImageKey(t *testing.T) {
	cases := map[string]struct {
		rest string
		uid  string
		ok   bool
	}{
		"AnImageKey":                   {rest: "image.img-1", uid: "img-1", ok: true},
		"AGuestUIDIsNotAnImage":        {rest: "6f1c2d9e-0b7a"},
		"AGuestNamedImageIsNotAnImage": {rest: "image"},
		"AVolumeKeyIsNotAnImage":       {rest: "volume.img-1"},
		"ADeeperKeyIsNotAnImage":       {rest: "image.a.b"},
		"AnEmptyUIDIsNotAnImage":       {rest: "image."},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			uid, ok := ParseImageKey(tc.rest)
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
