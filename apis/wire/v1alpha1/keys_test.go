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
		"JoinsNodeAndUID":              {node: "node1", uid: "6f1c2d9e-0b7a", want: "node1.6f1c2d9e-0b7a"},
		"RefusesADotThatWouldNestKeys": {node: "node1.example.com", uid: "u", wantErr: true},
		"RefusesAStarWildcard":         {node: "*", uid: "u", wantErr: true},
		"RefusesAFullWildcard":         {node: "node1", uid: ">", wantErr: true},
		"RefusesASpace":                {node: "node 1", uid: "u", wantErr: true},
		"RefusesAnEmptyUID":            {node: "node1", uid: "", wantErr: true},
		"RefusesAnOverlongToken":       {node: string(make([]byte, 129)), uid: "u", wantErr: true},
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
