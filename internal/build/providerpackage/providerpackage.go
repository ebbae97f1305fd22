// Package providerpackage builds virtfleet's Crossplane provider package (an
// xpkg) with Crossplane's own builder, parser and linter from
// crossplane-runtime's pkg/xpkg, so the package is what `crossplane xpkg
// build` would make and what Crossplane's package manager accepts: an OCI
// image whose one layer holds package.yaml (the metadata from crossplane.yaml
// followed by every CRD), labelled io.crossplane.xpkg: base.
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
	"sort"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/spf13/afero"

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
	stream, err := packageStream(dir)
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
	img, meta, err := xpkg.New(parser.NewEchoBackend(stream), noExamples, p, examples.New()).Build(ctx, xpkg.WithBase(runtime))
	if err != nil {
		return nil, nil, errors.Wrap(err, "cannot build the provider package")
	}
	prov, ok := meta.(*pkgmetav1.Provider)
	if !ok {
		return nil, nil, errors.Errorf("%s/crossplane.yaml is a %T, not a Provider", dir, meta)
	}
	// crossplane xpkg build records the layer annotation as a config label;
	// copying it onto the layer descriptor makes the annotation survive a push
	// to a registry, where the package manager looks for it.
	img, err = xpkg.AnnotateLayers(img)
	return img, prov, errors.Wrap(err, "cannot annotate the package layer")
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

// packageStream is crossplane.yaml followed by every CRD under dir/crds in
// name order, as one YAML stream.
func packageStream(dir string) (string, error) {
	meta, err := os.ReadFile(filepath.Join(dir, xpkg.MetaFile)) //nolint:gosec // the package directory is the repository's
	if err != nil {
		return "", errors.Wrap(err, "cannot read the package metadata")
	}
	crds, err := filepath.Glob(filepath.Join(dir, "crds", "*.yaml"))
	if err != nil {
		return "", errors.Wrap(err, "cannot list the CRDs")
	}
	if len(crds) == 0 {
		return "", errors.Errorf("no CRDs in %s: run make generate", filepath.Join(dir, "crds"))
	}
	sort.Strings(crds)
	docs := []string{string(meta)}
	for _, f := range crds {
		b, err := os.ReadFile(f) //nolint:gosec // listed from the package directory
		if err != nil {
			return "", errors.Wrap(err, "cannot read a CRD")
		}
		docs = append(docs, string(b))
	}
	return "---\n" + strings.Join(docs, "\n---\n"), nil
}
