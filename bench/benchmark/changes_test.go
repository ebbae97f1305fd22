package benchmark

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestChangedFieldsNamesWhatAWriteChanged(t *testing.T) {
	volume := func(rv string, attached []any, synced string) []byte {
		return encoded(t, map[string]any{
			"metadata": map[string]any{"resourceVersion": rv, "managedFields": []any{map[string]any{"manager": rv}}},
			"status": map[string]any{
				"atProvider": map[string]any{"node": "n1", "attachedTo": attached},
				"conditions": []any{
					map[string]any{"type": "Ready", "status": "True"},
					map[string]any{"type": "Synced", "status": "True", "lastTransitionTime": synced},
				},
			},
		})
	}
	cases := map[string]struct {
		before, after objectsSnapshot
		want          map[string]int
	}{
		"NothingWrittenNothingChanged": {
			before: objectsSnapshot{"Volume": {"u1": volume("1", []any{"vm"}, "t0")}},
			after:  objectsSnapshot{"Volume": {"u1": volume("1", []any{"vm"}, "t0")}},
			want:   map[string]int{},
		},
		"AWriteOfTheSameIsNoField": {
			before: objectsSnapshot{"Volume": {"u1": volume("1", []any{"vm"}, "t0")}},
			after:  objectsSnapshot{"Volume": {"u1": volume("2", []any{"vm"}, "t0")}},
			want:   map[string]int{},
		},
		"AConditionIsReadByType": {
			before: objectsSnapshot{"Volume": {"u1": volume("1", []any{"vm"}, "t0"), "u2": volume("1", []any{"vm"}, "t0")}},
			after:  objectsSnapshot{"Volume": {"u1": volume("2", []any{"vm"}, "t1"), "u2": volume("2", nil, "t1")}},
			want: map[string]int{
				"Volume status.conditions[Synced].lastTransitionTime": 2,
				"Volume status.atProvider.attachedTo":                 1,
			},
		},
		"ANewObjectIsNoChange": {
			before: objectsSnapshot{"Volume": {}},
			after:  objectsSnapshot{"Volume": {"u1": volume("1", nil, "t0")}},
			want:   map[string]int{},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := changedFields(tc.before, tc.after)
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

// encoded is o as snapshotObjects keeps it.
func encoded(t *testing.T, o map[string]any) []byte {
	t.Helper()
	b, err := json.Marshal(o)
	require.NoError(t, err)
	return b
}

func TestCountedPutsTheLargestFirst(t *testing.T) {
	assert.Equal(t, "`b` (3), `a` (1), `c` (1)", counted(map[string]int{"a": 1, "b": 3, "c": 1}))
}
