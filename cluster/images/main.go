// Command images builds virtfleet's hub and agent images without a container
// runtime and writes each as an image tarball in --out (`make images`):
//
//	go run ./cluster/images --out _output/images --registry ghcr.io/virtfleet --version v0.1.0
//
// Load one with `docker load -i`, `kind load image-archive` or push it with
// `crane push`. See internal/build/ociimage.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"time"

	"github.com/virtfleet/virtfleet/internal/build/ociimage"
	"github.com/virtfleet/virtfleet/internal/flagenv"
)

func main() {
	out := flag.String("out", "_output/images", "Directory the image tarballs are written to.")
	registry := flag.String("registry", "ghcr.io/virtfleet", "Registry and namespace of the image references.")
	version := flag.String("version", "dev", "Image tag and org.opencontainers.image.version label.")
	arch := flag.String("arch", runtime.GOARCH, "Target architecture.")
	if err := flagenv.ParseCommandLine(); err != nil {
		fmt.Fprintln(os.Stderr, "images:", err)
		os.Exit(2)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, *out, *registry, *version, ociimage.Platform{OS: "linux", Arch: *arch}); err != nil {
		fmt.Fprintln(os.Stderr, "images:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, out, registry, version string, p ociimage.Platform) error {
	created, err := sourceDateEpoch()
	if err != nil {
		return err
	}
	for _, spec := range ociimage.Virtfleet(version) {
		start := time.Now()
		bin := filepath.Join(out, "bin", p.OS+"_"+p.Arch, spec.Name)
		img, err := ociimage.BuildFromSource(ctx, ".", spec, bin, p, created)
		if err != nil {
			return err
		}
		ref := ociimage.Ref(registry, spec, version)
		file := filepath.Join(out, spec.Name+".tar")
		if err := ociimage.WriteTarball(file, ref, img); err != nil {
			return err
		}
		d, err := img.Digest()
		if err != nil {
			return err
		}
		fi, err := os.Stat(file)
		if err != nil {
			return err
		}
		fmt.Printf("%s\t%s@%s\t%.1f MiB\t%s\n", file, ref, d, float64(fi.Size())/(1<<20), time.Since(start).Round(100*time.Millisecond))
	}
	return nil
}

// sourceDateEpoch is the images' creation time: SOURCE_DATE_EPOCH if set (the
// reproducible-builds convention), else the Unix epoch, so that by default
// the same sources give the same digests.
func sourceDateEpoch() (time.Time, error) {
	v, ok := os.LookupEnv("SOURCE_DATE_EPOCH")
	if !ok {
		return time.Unix(0, 0).UTC(), nil
	}
	s, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH: %w", err)
	}
	return time.Unix(s, 0).UTC(), nil
}
