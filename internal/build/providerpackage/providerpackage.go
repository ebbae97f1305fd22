// Package providerpackage builds virtfleet's Crossplane packages — the
// provider (the hub), the composition function and the Configuration with the
// XRDs and Compositions — as xpkgs with Crossplane's own builder, parser and
// linter from
// crossplane-runtime's pkg/xpkg, so the package is what `crossplane xpkg
// build` would make and what Crossplane's package manager accepts: an OCI
// image whose one layer holds package.yaml (the metadata from crossplane.yaml
// followed by every object), labelled io.crossplane.xpkg: base.
//
// In Crossplane v2 the package is also the provider's runtime image: the
// package manager runs the package's own image (its resolved source) as the
// provider Deployment, and the package metadata has no spec.controller.image
// any more. So the package is built on the hub image, as `crossplane xpkg
// build --embed-runtime-image` does: the hub's layers, entrypoint and user,
// plus the package.yaml layer.
package providerpackage

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/spf13/afero"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/xpkg"
	"github.com/crossplane/crossplane-runtime/v2/pkg/xpkg/parser"
	"github.com/crossplane/crossplane-runtime/v2/pkg/xpkg/parser/examples"
	pkgmetav1 "github.com/crossplane/crossplane/apis/v2/pkg/meta/v1"
)

// Build returns the provider package made from dir — dir/crossplane.yaml and
// the CRDs in dir/crds — on top of runtime, the hub image Crossplane runs for
// the provider. The package is linted as a Provider; a package Crossplane
// would refuse is an error here.
func Build(ctx context.Context, dir string, runtime v1.Image) (v1.Image, *pkgmetav1.Provider, error) {
	if runtime == nil {
		return nil, nil, errors.New("the runtime (hub) image is required")
	}
	crds, err := filepath.Glob(filepath.Join(dir, "crds", "*.yaml"))
	if err != nil {
		return nil, nil, errors.Wrap(err, "cannot list the CRDs")
	}
	if len(crds) == 0 {
		return nil, nil, errors.Errorf("no CRDs in %s: run make generate", filepath.Join(dir, "crds"))
	}
	img, meta, err := build(ctx, dir, crds, runtime)
	if err != nil {
		return nil, nil, err
	}
	prov, ok := meta.(*pkgmetav1.Provider)
	if !ok {
		return nil, nil, errors.Errorf("%s/crossplane.yaml is a %T, not a Provider", dir, meta)
	}
	return img, prov, nil
}

// BuildFunction returns the composition function's package made from
// dir/crossplane.yaml (and any other YAML in dir, such as the input's CRD) on
// top of runtime, the function's image, which Crossplane runs as the
// function, as it runs a provider's package image.
func BuildFunction(ctx context.Context, dir string, runtime v1.Image) (v1.Image, *pkgmetav1.Function, error) {
	if runtime == nil {
		return nil, nil, errors.New("the runtime (function) image is required")
	}
	objs, err := objectFiles(dir)
	if err != nil {
		return nil, nil, err
	}
	img, meta, err := build(ctx, dir, objs, runtime)
	if err != nil {
		return nil, nil, err
	}
	fn, ok := meta.(*pkgmetav1.Function)
	if !ok {
		return nil, nil, errors.Errorf("%s/crossplane.yaml is a %T, not a Function", dir, meta)
	}
	return img, fn, nil
}

// BuildConfiguration returns the Configuration package made from
// dir/crossplane.yaml and the XRDs and Compositions in dir. A Configuration
// runs nothing, so its image is the package layer alone.
func BuildConfiguration(ctx context.Context, dir string) (v1.Image, *pkgmetav1.Configuration, error) {
	objs, err := objectFiles(dir)
	if err != nil {
		return nil, nil, err
	}
	img, meta, err := build(ctx, dir, objs, empty.Image)
	if err != nil {
		return nil, nil, err
	}
	c, ok := meta.(*pkgmetav1.Configuration)
	if !ok {
		return nil, nil, errors.Errorf("%s/crossplane.yaml is a %T, not a Configuration", dir, meta)
	}
	return img, c, nil
}

// build makes a package of dir/crossplane.yaml followed by objs on base,
// linted by Crossplane's linter for the package's kind.
func build(ctx context.Context, dir string, objs []string, base v1.Image) (v1.Image, runtime.Object, error) {
	stream, err := packageStream(dir, objs)
	if err != nil {
		return nil, nil, err
	}
	p, err := NewParser()
	if err != nil {
		return nil, nil, err
	}
	// The package carries no examples layer: Crossplane ignores it, and the
	// examples live in the repository. An examples backend that reports a
	// missing directory is how xpkg.Builder is told so.
	noExamples := parser.NewFsBackend(afero.NewMemMapFs(), parser.FsDir("/examples"))
	img, meta, err := xpkg.New(parser.NewEchoBackend(stream), noExamples, p, examples.New()).Build(ctx, xpkg.WithBase(base))
	if err != nil {
		return nil, nil, errors.Wrapf(err, "cannot build the package in %s", dir)
	}
	// crossplane xpkg build records the layer annotation as a config label;
	// copying it onto the layer descriptor makes the annotation survive a push
	// to a registry, where the package manager looks for it.
	img, err = xpkg.AnnotateLayers(img)
	return img, meta, errors.Wrap(err, "cannot annotate the package layer")
}

// objectFiles are the YAML files in dir besides crossplane.yaml.
func objectFiles(dir string) ([]string, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		return nil, errors.Wrap(err, "cannot list the package's objects")
	}
	return slices.DeleteFunc(files, func(f string) bool { return filepath.Base(f) == xpkg.MetaFile }), nil
}

// NewParser returns the parser Crossplane's package manager parses packages
// with: the package metadata scheme and the object scheme of CRDs, XRDs,
// Compositions, webhooks and the like.
func NewParser() (*parser.PackageParser, error) {
	meta, err := xpkg.BuildMetaScheme()
	if err != nil {
		return nil, errors.Wrap(err, "cannot build the package metadata scheme")
	}
	obj, err := xpkg.BuildObjectScheme()
	if err != nil {
		return nil, errors.Wrap(err, "cannot build the package object scheme")
	}
	return parser.New(meta, obj), nil
}

// packageStream is crossplane.yaml followed by every file of objs in name
// order, as one YAML stream.
func packageStream(dir string, objs []string) (string, error) {
	meta, err := os.ReadFile(filepath.Join(dir, xpkg.MetaFile)) //nolint:gosec // the package directory is the repository's
	if err != nil {
		return "", errors.Wrap(err, "cannot read the package metadata")
	}
	objs = slices.Clone(objs)
	sort.Strings(objs)
	docs := []string{string(meta)}
	for _, f := range objs {
		b, err := os.ReadFile(f) //nolint:gosec // listed from the package directory
		if err != nil {
			return "", errors.Wrap(err, "cannot read a package object")
		}
		docs = append(docs, string(b))
	}
	return "---\n" + strings.Join(docs, "\n---\n"), nil
}

// Package is one of virtfleet's packages: its kind (Provider, Function or
// Configuration), its name (the package metadata's, also the repository it is
// pushed to) and its image.
type Package struct {
	Kind  string
	Name  string
	Image v1.Image
}

// BuildAll builds virtfleet's three packages from dir (package/): the
// provider on hub, the function (dir/function) on function and the
// Configuration (dir/configuration), in the order they are installed.
func BuildAll(ctx context.Context, dir string, hub, function v1.Image) ([]Package, error) {
	prov, pm, err := Build(ctx, dir, hub)
	if err != nil {
		return nil, err
	}
	fn, fm, err := BuildFunction(ctx, filepath.Join(dir, "function"), function)
	if err != nil {
		return nil, err
	}
	cfg, cm, err := BuildConfiguration(ctx, filepath.Join(dir, "configuration"))
	if err != nil {
		return nil, err
	}
	return []Package{
		{Kind: pkgmetav1.ProviderKind, Name: pm.GetName(), Image: prov},
		{Kind: pkgmetav1.FunctionKind, Name: fm.GetName(), Image: fn},
		{Kind: pkgmetav1.ConfigurationKind, Name: cm.GetName(), Image: cfg},
	}, nil
}
