// Command build-package builds virtfleet's Crossplane provider package
// (`make package`) from package/ on top of the hub image that `make images`
// wrote, and writes it as an .xpkg image tarball:
//
//	go run ./hack/build-package --hub _output/images/hub.tar --hub-ref ghcr.io/virtfleet/virtfleet-hub:v0.1.0 \
//	    --ref ghcr.io/virtfleet/provider-virtfleet:v0.1.0 --out _output/provider-virtfleet.xpkg
//
// Push it with `crossplane xpkg push -f FILE REF` (which turns the layer
// labels into annotations) and install it with a Provider whose package is REF.
// See internal/build/providerpackage.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"

	"github.com/virtfleet/virtfleet/internal/build/ociimage"
	"github.com/virtfleet/virtfleet/internal/build/providerpackage"
	"github.com/virtfleet/virtfleet/internal/flagenv"
)

func main() {
	dir := flag.String("dir", "package", "Package directory: crossplane.yaml and crds/.")
	hub := flag.String("hub", "_output/images/hub.tar", "Hub image tarball, the provider's runtime image.")
	hubRef := flag.String("hub-ref", "", "Reference the hub image is tagged with in --hub.")
	ref := flag.String("ref", "", "Reference to tag the package with.")
	out := flag.String("out", "_output/provider-virtfleet.xpkg", "Package file to write.")
	if err := flagenv.ParseCommandLine(); err != nil {
		fmt.Fprintln(os.Stderr, "build-package:", err)
		os.Exit(2)
	}

	if err := run(context.Background(), *dir, *hub, *hubRef, *ref, *out); err != nil {
		fmt.Fprintln(os.Stderr, "build-package:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, dir, hub, hubRef, ref, out string) error {
	runtime, err := ociimage.ReadTarball(hub, hubRef)
	if err != nil {
		return err
	}
	img, _, err := providerpackage.Build(ctx, dir, runtime)
	if err != nil {
		return err
	}
	if err := ociimage.WriteTarball(out, ref, img); err != nil {
		return err
	}
	d, err := img.Digest()
	if err != nil {
		return err
	}
	fi, err := os.Stat(out)
	if err != nil {
		return err
	}
	fmt.Printf("%s\t%s@%s\t%.1f MiB\n", out, ref, d, float64(fi.Size())/(1<<20))
	return nil
}
