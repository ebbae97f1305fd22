// Command build-package builds virtfleet's Crossplane packages (`make
// package`) from package/ on top of the images `make images` wrote — the
// provider on the hub image, the function on the function image, and the
// Configuration with the XRDs and Compositions — and writes each as an .xpkg
// image tarball:
//
//	go run ./hack/build-package --images _output/images --registry ghcr.io/virtfleet --version v0.1.0 --out _output
//
// Push them with `crossplane xpkg push -f FILE REF` (which turns the layer
// labels into annotations) and install them as package/install.yaml does. See internal/build/providerpackage.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/virtfleet/virtfleet/internal/build/ociimage"
	"github.com/virtfleet/virtfleet/internal/build/providerpackage"
	"github.com/virtfleet/virtfleet/internal/flagenv"
)

func main() {
	dir := flag.String("dir", "package", "Package directory: crossplane.yaml and crds/, function/, configuration/.")
	images := flag.String("images", "_output/images", "Directory of the image tarballs `make images` wrote.")
	registry := flag.String("registry", "ghcr.io/virtfleet", "Registry and namespace of the images and packages.")
	version := flag.String("version", "dev", "Tag of the images and packages.")
	out := flag.String("out", "_output", "Directory the .xpkg files are written to.")
	if err := flagenv.ParseCommandLine(); err != nil {
		fmt.Fprintln(os.Stderr, "build-package:", err)
		os.Exit(2)
	}

	if err := run(context.Background(), *dir, *images, *registry, *version, *out); err != nil {
		fmt.Fprintln(os.Stderr, "build-package:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, dir, images, registry, version, out string) error {
	hub, err := ociimage.ReadTarball(filepath.Join(images, ociimage.Hub.Name+".tar"), ociimage.Ref(registry, ociimage.Hub, version))
	if err != nil {
		return err
	}
	fn, err := ociimage.ReadTarball(filepath.Join(images, ociimage.Function.Name+".tar"), ociimage.Ref(registry, ociimage.Function, version))
	if err != nil {
		return err
	}
	pkgs, err := providerpackage.BuildAll(ctx, dir, hub, fn)
	if err != nil {
		return err
	}
	for _, p := range pkgs {
		file := filepath.Join(out, p.Name+".xpkg")
		ref := registry + "/" + p.Name + ":" + version
		if err := ociimage.WriteTarball(file, ref, p.Image); err != nil {
			return err
		}
		d, err := p.Image.Digest()
		if err != nil {
			return err
		}
		fi, err := os.Stat(file)
		if err != nil {
			return err
		}
		fmt.Printf("%s\t%s@%s\t%.1f MiB\n", file, ref, d, float64(fi.Size())/(1<<20))
	}
	return nil
}
