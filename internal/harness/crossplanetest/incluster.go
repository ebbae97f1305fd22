package crossplanetest

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/internal/build/ociimage"
	"github.com/virtfleet/virtfleet/internal/harness/controlplane"
	"github.com/virtfleet/virtfleet/internal/harness/crossplanecore"
)

// Release is the Helm release Crossplane is installed as.
const Release = "crossplane"

// ImageRepository is the repository of reg Crossplane's image is pushed
// to, as its release publishes it (xpkg.crossplane.io/crossplane/crossplane).
const ImageRepository = "crossplane/crossplane"

// ClusterOptions configure InstallInCluster.
type ClusterOptions struct {
	// Dir holds helm's configuration and cache. Required.
	Dir string
	// Progress receives a line per step, and the first build's progress.
	Progress io.Writer
}

// InstallInCluster installs Crossplane on cp's nodes as a user does: its
// image, built here as its release builds it (crossplanecore.Image), is
// pushed to reg, and its own Helm chart is installed with helm (both
// built once per machine by crossplanecore), as the release Release into
// Namespace, with the chart's defaults but for where the image is: the
// chart's core Deployment (with its init container) and RBAC manager
// Deployment, their ServiceAccounts and RBAC, and the webhooks' Service.
// It returns once helm says both Deployments are available. The package
// manager then runs in a pod: it pulls packages from the references their
// objects name, so those must be ones a pod reaches (kubenode.PodsReach),
// and runs them with its default Deployment runtime, which the nodes'
// kubelets carry out. The API server must reach the webhooks' Service
// (controlplane.Options.ClusterEgress) and its pods the API server
// (controlplane.Options.InClusterAddress).
func InstallInCluster(ctx context.Context, cp *controlplane.ControlPlane, reg *Registry, o ClusterOptions) (*Crossplane, error) {
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	core, err := crossplanecore.Ensure(ctx, o.Progress)
	if err != nil {
		return nil, err
	}
	img, err := crossplanecore.Image(core, ociimage.Platform{OS: "linux", Arch: runtime.GOARCH}, time.Unix(0, 0).UTC())
	if err != nil {
		return nil, err
	}
	ref, err := reg.Push(ctx, ImageRepository, crossplanecore.Version, img)
	if err != nil {
		return nil, err
	}
	kube, err := packageClient(cp)
	if err != nil {
		return nil, err
	}
	args := append(HelmInstall(core.Chart),
		"--set", "image.repository="+strings.TrimSuffix(ref, ":"+crossplanecore.Version),
		"--set", "image.tag="+crossplanecore.Version,
		"--wait", "--timeout=5m")
	cmd := exec.CommandContext(ctx, core.Helm, args...) //nolint:gosec // the cache's own helm
	cmd.Env = append(os.Environ(), "KUBECONFIG="+cp.Kubeconfig,
		"HELM_CONFIG_HOME="+filepath.Join(o.Dir, "config"),
		"HELM_CACHE_HOME="+filepath.Join(o.Dir, "cache"),
		"HELM_DATA_HOME="+filepath.Join(o.Dir, "data"))
	start := time.Now()
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, errors.Wrapf(err, "helm %s: %s", strings.Join(args, " "), out)
	}
	fmt.Fprintf(o.Progress, "  %-14s %s installed by helm from its chart in %s, image %s\n", "crossplane", crossplanecore.Version, time.Since(start).Round(100*time.Millisecond), ref)
	return &Crossplane{Registry: reg, Client: kube, cp: cp, core: core, dir: o.Dir, prog: o.Progress, runtime: "Deployment"}, nil
}

// HelmInstall is the helm command, without its program name, that
// installs Crossplane's chart at chart as the README's step 1 does.
func HelmInstall(chart string) []string {
	return []string{"install", Release, chart, "--namespace", Namespace, "--create-namespace"}
}
