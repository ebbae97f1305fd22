package benchmark

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestChangedFieldsNamesWhatAWriteChanged(t *testing.T) {
	volume := func(rv string, attached []any, synced string) map[string]any {
		return map[string]any{
			"metadata": map[string]any{"resourceVersion": rv, "managedFields": []any{map[string]any{"manager": rv}}},
			"status": map[string]any{
				"atProvider": map[string]any{"node": "n1", "attachedTo": attached},
				"conditions": []any{
					map[string]any{"type": "Ready", "status": "True"},
					map[string]any{"type": "Synced", "status": "True", "lastTransitionTime": synced},
				},
			},
		}
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
			assert.Equal(t, tc.want, changedFields(tc.before, tc.after))
		})
	}
}

func TestCountedPutsTheLargestFirst(t *testing.T) {
	assert.Equal(t, "`b` (3), `a` (1), `c` (1)", counted(map[string]int{"a": 1, "b": 3, "c": 1}))
}
