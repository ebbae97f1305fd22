package providerpackage_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	extv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"

	"github.com/crossplane/crossplane-runtime/v2/pkg/xpkg"
	"github.com/crossplane/crossplane-runtime/v2/pkg/xpkg/parser"
	pkgmetav1 "github.com/crossplane/crossplane/apis/v2/pkg/meta/v1"

	"github.com/virtfleet/virtfleet/internal/build/ociimage"
	"github.com/virtfleet/virtfleet/internal/build/providerpackage"
	"github.com/virtfleet/virtfleet/internal/harness/controlplane"
)

// hubImage stands in for the hub image: a small binary in the real image
// spec, so the test checks what the package keeps of its runtime image.
func hubImage(t *testing.T) v1.Image {
	t.Helper()
	img, err := ociimage.Build(ociimage.Hub, []byte("hub binary"), ociimage.Platform{OS: "linux", Arch: "amd64"}, time.Unix(0, 0))
	require.NoError(t, err)
	return img
}

// TestPackageRoundTrip builds the provider package from the repository's
// package/ directory, writes it as an .xpkg tarball, reads it back and parses
// it the way Crossplane's package manager does (xpkg.ExtractPackageYAML, the
// package parser and the Provider linter).
func TestPackageRoundTrip(t *testing.T) {
	dir := filepath.Join(controlplane.RepoRoot(), "package")
	hub := hubImage(t)
	img, meta, err := providerpackage.Build(context.Background(), dir, hub)
	require.NoError(t, err)
	assert.Equal(t, "provider-virtfleet", meta.GetName())

	file := filepath.Join(t.TempDir(), "provider-virtfleet.xpkg")
	tag, err := name.NewTag("ghcr.io/virtfleet/provider-virtfleet:v0.0.0-test")
	require.NoError(t, err)
	require.NoError(t, tarball.WriteToFile(file, tag, img))

	read, err := tarball.ImageFromPath(file, &tag)
	require.NoError(t, err)

	t.Run("HubLayersThenPackageLayerLabelledBase", func(t *testing.T) {
		layers, err := read.Layers()
		require.NoError(t, err)
		hubLayers, err := hub.Layers()
		require.NoError(t, err)
		require.Len(t, layers, len(hubLayers)+1, "the hub's layers and package.yaml; no examples layer")
		for i := range hubLayers {
			want, err := hubLayers[i].Digest()
			require.NoError(t, err)
			got, err := layers[i].Digest()
			require.NoError(t, err)
			assert.Equal(t, want, got, "hub layer %d is embedded unchanged", i)
		}
		d, err := layers[len(layers)-1].Digest()
		require.NoError(t, err)
		cf, err := read.ConfigFile()
		require.NoError(t, err)
		// An image tarball has no place for layer annotations, so the
		// package records them as config labels; a push turns them back
		// into annotations (xpkg.AnnotateLayers).
		assert.Equal(t, xpkg.PackageAnnotation, cf.Config.Labels[xpkg.Label(d.String())])
	})

	t.Run("RunsAsTheHub", func(t *testing.T) {
		cf, err := read.ConfigFile()
		require.NoError(t, err)
		// Crossplane runs the package image itself as the provider.
		assert.Equal(t, []string{ociimage.Hub.Path}, cf.Config.Entrypoint)
		assert.Equal(t, ociimage.NonRootUser, cf.Config.User)
	})

	t.Run("AnnotatedAfterPush", func(t *testing.T) {
		pushed, err := xpkg.AnnotateLayers(read)
		require.NoError(t, err)
		m, err := pushed.Manifest()
		require.NoError(t, err)
		var base int
		for _, l := range m.Layers {
			if l.Annotations[xpkg.AnnotationKey] == xpkg.PackageAnnotation {
				base++
			}
		}
		assert.Equal(t, 1, base, "exactly one layer is annotated io.crossplane.xpkg: base")
	})

	t.Run("ParsedAndLintedLikeCrossplane", func(t *testing.T) {
		pushed, err := xpkg.AnnotateLayers(read)
		require.NoError(t, err)
		pkg := parse(t, pushed)
		require.NoError(t, xpkg.NewProviderLinter().Lint(pkg))

		require.Len(t, pkg.GetMeta(), 1)
		prov, ok := pkg.GetMeta()[0].(*pkgmetav1.Provider)
		require.True(t, ok, "the meta is a %T", pkg.GetMeta()[0])
		assert.Equal(t, "provider-virtfleet", prov.GetName())
		assert.Contains(t, prov.Spec.Capabilities, "safe-start")

		want, err := filepath.Glob(filepath.Join(dir, "crds", "*.yaml"))
		require.NoError(t, err)
		var got []string
		for _, o := range pkg.GetObjects() {
			crd, ok := o.(*extv1.CustomResourceDefinition)
			require.True(t, ok, "every object is a CRD, got %T", o)
			got = append(got, crd.Spec.Group+"_"+crd.Spec.Names.Plural+".yaml")
		}
		var wantNames []string
		for _, f := range want {
			wantNames = append(wantNames, filepath.Base(f))
		}
		assert.ElementsMatch(t, wantNames, got, "every generated CRD is in the package")
	})
}

// parse reads a package image as Crossplane's package manager does.
func parse(t *testing.T, img v1.Image) *parser.Package {
	t.Helper()
	rc, err := xpkg.ExtractPackageYAML(img)
	require.NoError(t, err)
	defer func() { _ = rc.Close() }()
	p, err := providerpackage.NewParser()
	require.NoError(t, err)
	pkg, err := p.Parse(context.Background(), rc)
	require.NoError(t, err)
	return pkg
}

// TestBuildRefuses pins the inputs the builder must refuse rather than
// produce a package Crossplane would reject at install time.
func TestBuildRefuses(t *testing.T) {
	repoPkg := filepath.Join(controlplane.RepoRoot(), "package")
	meta, err := os.ReadFile(filepath.Join(repoPkg, "crossplane.yaml"))
	require.NoError(t, err)
	hub := hubImage(t)
	cases := map[string]struct {
		meta    string
		crds    bool
		runtime v1.Image
	}{
		"NoRuntimeImage":  {meta: string(meta), crds: true, runtime: nil},
		"NoCRDs":          {meta: string(meta), crds: false, runtime: hub},
		"NotAProvider":    {meta: "apiVersion: meta.pkg.crossplane.io/v1\nkind: Configuration\nmetadata:\n  name: c\n", crds: true, runtime: hub},
		"BadVersionRange": {meta: "apiVersion: meta.pkg.crossplane.io/v1\nkind: Provider\nmetadata:\n  name: p\nspec:\n  crossplane:\n    version: not-a-range\n", crds: true, runtime: hub},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			require.NoError(t, os.WriteFile(filepath.Join(dir, "crossplane.yaml"), []byte(tc.meta), 0o600))
			require.NoError(t, os.MkdirAll(filepath.Join(dir, "crds"), 0o750))
			if tc.crds {
				crd, err := os.ReadFile(filepath.Join(repoPkg, "crds", "compute.virtfleet.io_virtualmachines.yaml"))
				require.NoError(t, err)
				require.NoError(t, os.WriteFile(filepath.Join(dir, "crds", "vm.yaml"), crd, 0o600))
			}
			_, _, err := providerpackage.Build(context.Background(), dir, tc.runtime)
			assert.Error(t, err)
		})
	}
}

// TestBuildAll builds the three packages from package/, each linted by
// Crossplane's linter for its kind, in the order they are installed.
func TestBuildAll(t *testing.T) {
	dir := filepath.Join(controlplane.RepoRoot(), "package")
	fn, err := ociimage.Build(ociimage.Function, []byte("function binary"), ociimage.Platform{OS: "linux", Arch: "amd64"}, time.Unix(0, 0))
	require.NoError(t, err)
	pkgs, err := providerpackage.BuildAll(context.Background(), dir, hubImage(t), fn)
	require.NoError(t, err)
	names := make([]string, 0, len(pkgs))
	for _, p := range pkgs {
		names = append(names, p.Name)
	}
	assert.Equal(t, []string{"provider-virtfleet", "function-virtfleet", "configuration-virtfleet"}, names)

	t.Run("ConfigurationHoldsBothXRDsAndCompositions", func(t *testing.T) {
		rc, err := xpkg.ExtractPackageYAML(pkgs[2].Image)
		require.NoError(t, err)
		p, err := providerpackage.NewParser()
		require.NoError(t, err)
		pkg, err := p.Parse(context.Background(), rc)
		require.NoError(t, err)
		kinds := map[string]int{}
		for _, o := range pkg.GetObjects() {
			kinds[o.GetObjectKind().GroupVersionKind().Kind]++
		}
		assert.Equal(t, map[string]int{"CompositeResourceDefinition": 2, "Composition": 2}, kinds)
	})
}
