package manifests_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/virtfleet/virtfleet/internal/harness/controlplane"
	"github.com/virtfleet/virtfleet/internal/harness/manifests"
)

func TestLoad(t *testing.T) {
	cases := []struct {
		name    string
		files   map[string]string
		want    []string // kind/name in load order
		wantErr string
	}{
		{
			name:  "multi-document file keeps document order",
			files: map[string]string{"a.yaml": "apiVersion: v1\nkind: Namespace\nmetadata: {name: one}\n---\napiVersion: v1\nkind: Namespace\nmetadata: {name: two}\n"},
			want:  []string{"Namespace/one", "Namespace/two"},
		},
		{
			name:  "files load in lexical path order across directories",
			files: map[string]string{"b/x.yaml": "apiVersion: v1\nkind: Namespace\nmetadata: {name: b}\n", "a/y.yml": "apiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n"},
			want:  []string{"Namespace/a", "Namespace/b"},
		},
		{
			name:  "empty documents and other files are skipped",
			files: map[string]string{"a.yaml": "---\n# only a comment\n---\napiVersion: v1\nkind: Namespace\nmetadata: {name: one}\n", "README.md": "# not a manifest"},
			want:  []string{"Namespace/one"},
		},
		{
			name:    "a document without kind is an error naming the file",
			files:   map[string]string{"bad.yaml": "apiVersion: v1\nmetadata: {name: x}\n"},
			wantErr: "bad.yaml: document 0 has no apiVersion or kind",
		},
		{
			name:    "malformed YAML is an error naming the file",
			files:   map[string]string{"broken.yaml": "apiVersion: v1\nkind: [unclosed\n"},
			wantErr: "broken.yaml",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for name, body := range tc.files {
				require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755))
				require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600))
			}
			objs, err := manifests.Load(dir)
			if tc.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, kindNames(objs))
		})
	}
}

// TestRepositoryManifests pins properties of the manifests users apply
// directly; the API server's view of them is tested in apis/compute.
func TestRepositoryManifests(t *testing.T) {
	root := controlplane.RepoRoot()

	t.Run("ProviderPackageDeclaresSafeStart", func(t *testing.T) {
		objs, err := manifests.Load(filepath.Join(root, "package", "crossplane.yaml"))
		require.NoError(t, err)
		require.Len(t, objs, 1)
		assert.Equal(t, "meta.pkg.crossplane.io/v1", objs[0].GetAPIVersion())
		assert.Equal(t, "Provider", objs[0].GetKind())
		caps, _, err := unstructured.NestedStringSlice(objs[0].Object, "spec", "capabilities")
		require.NoError(t, err)
		assert.Contains(t, caps, "safe-start")
	})

	t.Run("ExamplesHaveOneManifestPerKindAndTheSeedVM", func(t *testing.T) {
		objs, err := manifests.Load(filepath.Join(root, "examples"))
		require.NoError(t, err)
		kinds := map[string]int{}
		for _, o := range objs {
			kinds[o.GetKind()]++
		}
		for _, k := range []string{"VirtualMachine", "Volume", "VirtualNetwork", "DiskImage", "ProviderConfig", "ClusterProviderConfig"} {
			assert.Positive(t, kinds[k], "examples/ has no %s", k)
		}
		assert.Contains(t, kindNames(objs), "VirtualMachine/sample-vm")
	})
}

func kindNames(objs []*unstructured.Unstructured) []string {
	out := make([]string, 0, len(objs))
	for _, o := range objs {
		out = append(out, o.GetKind()+"/"+o.GetName())
	}
	return out
}
