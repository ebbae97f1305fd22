package v1alpha1

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestNameFromNode(t *testing.T) {
	cases := map[string]struct {
		namespace, onNode string
		want              string
		ok                bool
	}{
		"AVolumeOfTheNamespace":           {namespace: "team-a", onNode: NameOnNode("team-a", "data"), want: "data", ok: true},
		"ADottedName":                     {namespace: "team-a", onNode: NameOnNode("team-a", "db.data-1"), want: "db.data-1", ok: true},
		"TheLongestName":                  {namespace: "a", onNode: NameOnNode("a", strings.Repeat("x", 253)), want: strings.Repeat("x", 253), ok: true},
		"AVolumeOfAnotherNamespace":       {namespace: "team-a", onNode: NameOnNode("team-b", "data")},
		"ANamespaceThatOnlyStartsTheSame": {namespace: "team", onNode: NameOnNode("team-a", "data")},
		"AnImportedVolumesOwnName":        {namespace: "team-a", onNode: "legacy-data.img"},
		"NoNameAfterTheNamespace":         {namespace: "team-a", onNode: "team-a_"},
		"ASecondSeparator":                {namespace: "team-a", onNode: "team-a_data_1"},
		"AnUppercaseLetter":               {namespace: "team-a", onNode: "team-a_Data"},
		"ALabelEndingInADash":             {namespace: "team-a", onNode: "team-a_data-.x"},
		"AnEmptyLabel":                    {namespace: "team-a", onNode: "team-a_data..x"},
		"ANameTooLong":                    {namespace: "a", onNode: NameOnNode("a", strings.Repeat("x", 254))},
		"NoNamespace":                     {namespace: "", onNode: "_data"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, ok := NameFromNode(tc.namespace, tc.onNode)
			assert.Equal(t, tc.ok, ok)
			assert.Equal(t, tc.want, got)
			if ok {
				assert.Equal(t, tc.onNode, NameOnNode(tc.namespace, got), "the inverse of NameOnNode")
			}
		})
	}
}
