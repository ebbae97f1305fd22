// Package ociimage builds virtfleet's container images without a container
// runtime: one static Go binary on an empty base, written as an image tarball
// that `docker load`, `crane push` or `kind load image-archive` accept.
//
// The images are reproducible: every timestamp is fixed and every file is
// owned by root with a fixed mode, so the same sources give the same digest
// on any machine, and a package can pin the hub image by digest.
package ociimage

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	buildversion "github.com/virtfleet/virtfleet/internal/version"
)

// Spec describes one single-binary image.
type Spec struct {
	// Name is the image's short name, e.g. hub.
	Name string
	// Module is the directory of the Go module the binary is built in,
	// relative to the repository root; empty means the root module.
	Module string
	// GoPackage is the main package the binary is built from, relative to
	// Module, e.g. ./hub.
	GoPackage string
	// Path is where the binary lives in the image; it is the entrypoint.
	Path string
	// User is the image's default user, uid:gid.
	User string
	// Labels are OCI labels on the image config.
	Labels map[string]string
	// Version, when set, is stamped into the binary as the version it
	// reports (internal/version).
	Version string
}

// Platform is the platform an image is built for.
type Platform struct {
	OS, Arch string
}

// Build returns the image of spec with the binary read from binary. Created
// is the time recorded for the image and its files; use a fixed time (for
// example SOURCE_DATE_EPOCH) for reproducible digests.
func Build(spec Spec, binary []byte, p Platform, created time.Time) (v1.Image, error) {
	layer, err := binaryLayer(spec.Path, binary, created)
	if err != nil {
		return nil, err
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return nil, errors.Wrap(err, "cannot add the binary layer")
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, errors.Wrap(err, "cannot read the image config")
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = p.OS, p.Arch
	cf.Created = v1.Time{Time: created}
	cf.Config.Entrypoint = []string{spec.Path}
	cf.Config.User = spec.User
	cf.Config.Labels = spec.Labels
	// There is no shell and no ld.so in the image; the binary is the only
	// file, so PATH only matters to tools that inspect the config.
	cf.Config.Env = []string{"PATH=" + path.Dir(spec.Path)}
	// The history entry keeps `docker history` and scanners honest about
	// what made the layer.
	cf.History = []v1.History{{Created: v1.Time{Time: created}, CreatedBy: "ociimage: static " + spec.GoPackage + " at " + spec.Path}}
	img, err = mutate.ConfigFile(img, cf)
	return img, errors.Wrap(err, "cannot set the image config")
}

// binaryLayer is a layer holding the binary and its parent directories, all
// owned by root, so that a non-root user can execute but not replace it.
func binaryLayer(file string, binary []byte, mtime time.Time) (v1.Layer, error) {
	var files []File
	dirs := strings.Split(strings.Trim(path.Dir(file), "/"), "/")
	for i := range dirs {
		if dirs[i] != "" {
			files = append(files, File{Name: "/" + path.Join(dirs[:i+1]...), Mode: 0o755, Dir: true})
		}
	}
	files = append(files, File{Name: file, Mode: 0o755, Data: binary})
	return FilesLayer(files, mtime)
}

// File is a file or directory of a layer, owned by root.
type File struct {
	// Name is its absolute path in the image.
	Name string
	// Mode holds its permission bits (and sticky bit).
	Mode int64
	// Dir makes it a directory; else it is a regular file holding Data.
	Dir  bool
	Data []byte
}

// FilesLayer is a layer holding files, in their order (parents before
// what they hold), each with modification time mtime.
func FilesLayer(files []File, mtime time.Time) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		hdr := &tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(f.Name, "/"), Mode: f.Mode, Size: int64(len(f.Data)), ModTime: mtime, Format: tar.FormatPAX}
		if f.Dir {
			hdr.Typeflag, hdr.Name, hdr.Size = tar.TypeDir, hdr.Name+"/", 0
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, errors.Wrapf(err, "cannot write %s to the layer", f.Name)
		}
		if _, err := tw.Write(f.Data); err != nil {
			return nil, errors.Wrapf(err, "cannot write %s to the layer", f.Name)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, errors.Wrap(err, "cannot close the layer")
	}
	b := buf.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	return l, errors.Wrap(err, "cannot make the layer")
}

// WriteTarball writes img to file as an image tarball tagged ref.
func WriteTarball(file, ref string, img v1.Image) error {
	tag, err := name.NewTag(ref)
	if err != nil {
		return errors.Wrapf(err, "cannot parse image reference %q", ref)
	}
	if err := os.MkdirAll(path.Dir(file), 0o750); err != nil {
		return errors.Wrap(err, "cannot create the output directory")
	}
	return errors.Wrapf(tarball.WriteToFile(file, tag, img), "cannot write %s", file)
}

// ReadTarball reads the image tagged ref from an image tarball.
func ReadTarball(file, ref string) (v1.Image, error) {
	tag, err := name.NewTag(ref)
	if err != nil {
		return nil, errors.Wrapf(err, "cannot parse image reference %q", ref)
	}
	img, err := tarball.ImageFromPath(file, &tag)
	return img, errors.Wrapf(err, "cannot read %s from %s", ref, file)
}

// BuildBinary compiles the main package pkg (relative to dir, the module
// root) into out as a static, reproducible binary for p: no cgo, so it runs
// on an empty base; -trimpath and an empty build id, so two builds of the
// same sources are byte for byte the same. A version, when not empty, is
// stamped into internal/version; the linker ignores it in a binary without
// that package (the composition function's, of a module of its own).
func BuildBinary(ctx context.Context, dir, pkg, out string, p Platform, version string) error {
	ldflags := "-s -w -buildid="
	if version != "" {
		ldflags += " -X " + buildversion.Symbol + "=" + version
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags="+ldflags, "-o", out, pkg) //nolint:gosec // the package comes from the image table, not from a user
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+p.OS, "GOARCH="+p.Arch)
	if b, err := cmd.CombinedOutput(); err != nil {
		return errors.Wrapf(err, "cannot build %s: %s", pkg, strings.TrimSpace(string(b)))
	}
	return nil
}

// BuildFromSource compiles spec's binary from the repository at root (its
// Module below root) into out and returns the image holding it.
func BuildFromSource(ctx context.Context, root string, spec Spec, out string, p Platform, created time.Time) (v1.Image, error) {
	if err := BuildBinary(ctx, filepath.Join(root, spec.Module), spec.GoPackage, out, p, spec.Version); err != nil {
		return nil, err
	}
	b, err := os.ReadFile(out) //nolint:gosec // written just above
	if err != nil {
		return nil, errors.Wrapf(err, "cannot read the %s binary", spec.Name)
	}
	return Build(spec, b, p, created)
}
