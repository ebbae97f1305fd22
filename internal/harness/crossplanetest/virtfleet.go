package crossplanetest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	pkgv1 "github.com/crossplane/crossplane/apis/v2/pkg/v1"

	"github.com/virtfleet/virtfleet/internal/build/ociimage"
	"github.com/virtfleet/virtfleet/internal/build/providerpackage"
	"github.com/virtfleet/virtfleet/internal/harness/controlplane"
	"github.com/virtfleet/virtfleet/internal/harness/crossplanecore"
	"github.com/virtfleet/virtfleet/internal/harness/manifests"
	"github.com/virtfleet/virtfleet/internal/harness/stack"
)

// Names of virtfleet's packages (package/**/crossplane.yaml).
const (
	Provider      = "provider-virtfleet"
	Function      = "function-virtfleet"
	Configuration = "configuration-virtfleet"
)

// SizesFile is the EnvironmentConfig of size classes under package/, and
// Sizes its name, which the Compositions require.
const (
	SizesFile = "sizes.yaml"
	Sizes     = "virtfleet-sizes"
)

// PackageTag is the tag the harness pushes virtfleet's packages with.
const PackageTag = "v0.0.0-local"

// StackOptions returns o set up to install virtfleet into Crossplane, as a
// user would, instead of applying its CRDs and RBAC: the control plane
// starts with Crossplane's CRDs alone, and once it is up Crossplane starts
// (into *xp), virtfleet's three packages are built on images of this tree's
// binaries, pushed and installed, the function runs, and the hub is given
// the provider's identity. After stack.Start, call Ready.
func StackOptions(ctx context.Context, o stack.Options, xp **Crossplane) (stack.Options, error) {
	core, err := crossplanecore.Ensure(ctx, o.Progress)
	if err != nil {
		return o, err
	}
	o.CRDDirs = []string{core.CRDs}
	progress := o.Progress
	o.Install = func(ctx context.Context, s *stack.Stack) (string, error) {
		x, err := Start(ctx, s.ControlPlane, Options{Dir: filepath.Join(s.Dir(), "crossplane"), Progress: progress})
		if err != nil {
			return "", err
		}
		*xp = x
		kubeconfig, err := x.installVirtfleet(ctx, s)
		if err != nil {
			x.Stop()
			*xp = nil
		}
		return kubeconfig, err
	}
	return o, nil
}

// Ready says, as the hub's runtime, that the hub runs, and waits until the
// three packages are Healthy.
func (x *Crossplane) Ready(ctx context.Context) error {
	if err := x.MarkRuntimeHealthy(ctx, pkgv1.ProviderKind, Provider); err != nil {
		return err
	}
	for _, p := range []struct{ kind, name string }{{pkgv1.ProviderKind, Provider}, {pkgv1.FunctionKind, Function}, {pkgv1.ConfigurationKind, Configuration}} {
		if err := x.WaitPackage(ctx, p.kind, p.name, pkgv1.TypeHealthy, time.Minute); err != nil {
			return err
		}
	}
	return nil
}

// installVirtfleet builds the packages, installs them, runs the function
// and returns the provider's kubeconfig.
func (x *Crossplane) installVirtfleet(ctx context.Context, s *stack.Stack) (string, error) {
	platform := ociimage.Platform{OS: "linux", Arch: "amd64"}
	hub, err := imageOf(ociimage.Hub, s.Binary("hub"), platform)
	if err != nil {
		return "", err
	}
	fnPath := filepath.Join(s.Dir(), "bin", "function")
	// The function is a module of its own (function/go.mod).
	build := exec.CommandContext(ctx, "go", "build", "-o", fnPath, ".")
	build.Dir = filepath.Join(controlplane.RepoRoot(), ociimage.Function.Module)
	if out, err := build.CombinedOutput(); err != nil {
		return "", errors.Errorf("cannot build the function: %v\n%s", err, out)
	}
	fn, err := imageOf(ociimage.Function, fnPath, platform)
	if err != nil {
		return "", err
	}
	pkgs, err := providerpackage.BuildAll(ctx, filepath.Join(controlplane.RepoRoot(), "package"), hub, fn)
	if err != nil {
		return "", err
	}
	if err := x.Install(ctx, PackageTag, pkgs); err != nil {
		return "", err
	}
	// The size classes the Compositions require, as the README's install
	// section applies them.
	sizes, err := manifests.Load(filepath.Join(controlplane.RepoRoot(), "package", SizesFile))
	if err != nil {
		return "", err
	}
	if err := s.ControlPlane.ApplyObjects(ctx, sizes); err != nil {
		return "", errors.Wrap(err, "cannot apply the size classes")
	}
	if err := x.RunFunction(ctx, Function, fnPath); err != nil {
		return "", err
	}
	return x.ProviderIdentity(ctx, Provider)
}

// imageOf is the image of spec around the binary at path.
func imageOf(spec ociimage.Spec, path string, p ociimage.Platform) (v1.Image, error) {
	b, err := os.ReadFile(path) //nolint:gosec // a binary this harness or the stack built
	if err != nil {
		return nil, errors.Wrapf(err, "cannot read %s", path)
	}
	return ociimage.Build(spec, b, p, time.Unix(0, 0))
}
