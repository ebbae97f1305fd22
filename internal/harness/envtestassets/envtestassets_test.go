package envtestassets

import (
	"context"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/virtfleet/virtfleet/internal/harness/modbuild"
)

func TestEnsure(t *testing.T) {
	complete := func(t *testing.T) string {
		dir := t.TempDir()
		for _, b := range Binaries {
			require.NoError(t, os.WriteFile(filepath.Join(dir, b), nil, 0o755))
		}
		return dir
	}
	cases := []struct {
		name    string
		env     func(t *testing.T) (assets, cache string)
		want    func(assets, cache string) string
		wantErr string
	}{
		{
			name: "KUBEBUILDER_ASSETS wins when complete",
			env:  func(t *testing.T) (string, string) { return complete(t), t.TempDir() },
			want: func(assets, _ string) string { return assets },
		},
		{
			name: "KUBEBUILDER_ASSETS without etcd is an error naming it",
			env: func(t *testing.T) (string, string) {
				d := complete(t)
				require.NoError(t, os.Remove(filepath.Join(d, "etcd")))
				return d, t.TempDir()
			},
			wantErr: "lacks [etcd]",
		},
		{
			name: "a complete cache is returned without building",
			env: func(t *testing.T) (string, string) {
				cache := t.TempDir()
				t.Setenv(EnvCacheDir, cache)
				dir, err := CacheDir()
				require.NoError(t, err)
				require.NoError(t, os.MkdirAll(dir, 0o755))
				for _, b := range Binaries {
					require.NoError(t, os.WriteFile(filepath.Join(dir, b), nil, 0o755))
				}
				return "", cache
			},
			want: func(_, cache string) string {
				return filepath.Join(cache, "envtest", "kubernetes-"+KubernetesVersion+"-etcd-"+EtcdVersion)
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			assets, cache := tc.env(t)
			t.Setenv(EnvAssets, assets)
			t.Setenv(EnvCacheDir, cache)
			got, err := Ensure(context.Background(), io.Discard)
			if tc.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want(assets, cache), got)
		})
	}
}

// TestTargetsPinEveryStagingModule guards the build recipe: k8s.io/kubernetes
// replaces its staging modules with local directories, so each one must be
// pinned to the published version or `go get` fails to resolve.
func TestTargetsPinEveryStagingModule(t *testing.T) {
	byBinary := map[string]modbuild.Target{}
	for _, tg := range targets() {
		byBinary[tg.Binary] = tg
	}
	for _, b := range Binaries {
		assert.Contains(t, byBinary, b, "no build target for %s", b)
	}
	api := byBinary["kube-apiserver"]
	assert.Len(t, api.Replace, len(stagingModules))
	assert.Contains(t, api.Replace, "k8s.io/client-go=k8s.io/client-go@"+StagingVersion)
	assert.Empty(t, byBinary["etcd"].Replace, "etcd resolves without replacements")
}

// TestGarbageCollectorTarget guards the garbage collector's recipe: it is
// this repository's own main package, built against the same Kubernetes
// release and staging modules as kube-apiserver, so that the two share
// their build.
func TestGarbageCollectorTarget(t *testing.T) {
	gc := garbageCollectorTarget()
	api := targets()[0]
	assert.Equal(t, GarbageCollector, gc.Binary)
	assert.Equal(t, api.Module, gc.Module)
	assert.Equal(t, api.Version, gc.Version)
	assert.Equal(t, api.Replace, gc.Replace)
	require.NotNil(t, gc.Source)
	main, err := fs.ReadFile(gc.Source, "main.go")
	require.NoError(t, err)
	assert.Contains(t, string(main), "\npackage main\n")
	assert.Contains(t, string(main), `"k8s.io/kubernetes/pkg/controller/garbagecollector"`)
}

// TestNodeTargets guards the node binaries' recipe: the kubelet and
// kube-proxy of the same release as kube-apiserver, with the same staging
// modules, so that they share its build.
func TestNodeTargets(t *testing.T) {
	api := targets()[0]
	got := nodeTargets()
	require.Len(t, got, len(NodeBinaries))
	for i, tg := range got {
		assert.Equal(t, NodeBinaries[i], tg.Binary)
		assert.Equal(t, "k8s.io/kubernetes/cmd/"+NodeBinaries[i], tg.Package)
		assert.Equal(t, api.Module, tg.Module)
		assert.Equal(t, api.Version, tg.Version)
		assert.Equal(t, api.Replace, tg.Replace)
		assert.Equal(t, []string{
			"k8s.io/component-base/version.gitVersion=" + KubernetesVersion,
			"k8s.io/component-base/version.gitMajor=1",
			"k8s.io/component-base/version.gitMinor=34",
		}, tg.Vars)
	}
}

// TestEnsureNodeFindsABuiltCache: a cache holding the node binaries is
// returned without building.
func TestEnsureNodeFindsABuiltCache(t *testing.T) {
	t.Setenv(EnvCacheDir, t.TempDir())
	dir, err := CacheDir()
	require.NoError(t, err)
	require.NoError(t, os.MkdirAll(dir, 0o755))
	for _, b := range NodeBinaries {
		require.NoError(t, os.WriteFile(filepath.Join(dir, b), nil, 0o755))
	}
	got, err := EnsureNode(context.Background(), io.Discard)
	require.NoError(t, err)
	assert.Equal(t, dir, got)
}
