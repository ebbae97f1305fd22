package ociimage_test

import (
	"archive/tar"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/virtfleet/virtfleet/internal/build/ociimage"
)

var epoch = time.Unix(0, 0).UTC()

// tinyMain is a program small enough to compile in a second, standing in for
// the hub and agent: what is tested is the image around the binary.
const tinyMain = "package main\n\nfunc main() { println(\"virtfleet\") }\n"

func buildTinyBinary(t *testing.T) []byte {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module tiny\n\ngo 1.22\n"), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "main.go"), []byte(tinyMain), 0o600))
	out := filepath.Join(dir, "tiny")
	require.NoError(t, ociimage.BuildBinary(context.Background(), dir, ".", out, ociimage.Platform{OS: "linux", Arch: runtime.GOARCH}, "v0.0.0-test"))
	b, err := os.ReadFile(out)
	require.NoError(t, err)
	return b
}

// TestBinariesReportTheVersionTheyWereBuiltAs builds a program of this
// module that prints what internal/version says, as the image builds
// build the hub and the agent: with a version, it reports that version;
// without, not that one.
func TestBinariesReportTheVersionTheyWereBuiltAs(t *testing.T) {
	cases := map[string]struct {
		version string
		want    func(t *testing.T, got string)
	}{
		"Stamped":   {version: "v9.8.7-test", want: func(t *testing.T, got string) { assert.Equal(t, "v9.8.7-test", got) }},
		"Unstamped": {want: func(t *testing.T, got string) { assert.NotEqual(t, "v9.8.7-test", got); assert.NotEmpty(t, got) }},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "printversion")
			require.NoError(t, ociimage.BuildBinary(context.Background(), repoRoot(t), "./internal/version/testdata/printversion", out,
				ociimage.Platform{OS: runtime.GOOS, Arch: runtime.GOARCH}, tc.version))
			got, err := exec.Command(out).Output() //nolint:gosec // built just above
			require.NoError(t, err)
			tc.want(t, strings.TrimSpace(string(got)))
		})
	}
}

// repoRoot is the module's root, two directories above this package.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", "..", ".."))
	require.NoError(t, err)
	return root
}

// TestImages builds each virtfleet image around a real static binary, writes
// it as a tarball, reads it back and checks what a runtime would see.
func TestImages(t *testing.T) {
	bin := buildTinyBinary(t)
	cases := map[string]struct {
		spec     ociimage.Spec
		wantUser string
		wantPath string
	}{
		"HubRunsAsNonRoot":       {spec: ociimage.Virtfleet("v0.0.0-test")[0], wantUser: "65532:65532", wantPath: "/usr/local/bin/hub"},
		"AgentRunsAsSocketOwner": {spec: ociimage.Virtfleet("v0.0.0-test")[1], wantUser: "0:0", wantPath: "/usr/local/bin/agent"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			img, err := ociimage.Build(tc.spec, bin, ociimage.Platform{OS: "linux", Arch: "amd64"}, epoch)
			require.NoError(t, err)
			file := filepath.Join(t.TempDir(), tc.spec.Name+".tar")
			ref := "ghcr.io/virtfleet/virtfleet-" + tc.spec.Name + ":v0.0.0-test"
			require.NoError(t, ociimage.WriteTarball(file, ref, img))

			got, err := ociimage.ReadTarball(file, ref)
			require.NoError(t, err)
			cf, err := got.ConfigFile()
			require.NoError(t, err)
			assert.Equal(t, []string{tc.wantPath}, cf.Config.Entrypoint)
			assert.Equal(t, tc.wantUser, cf.Config.User)
			assert.Equal(t, "linux", cf.OS)
			assert.Equal(t, "amd64", cf.Architecture)
			assert.Equal(t, epoch, cf.Created.UTC(), "a fixed creation time keeps the digest reproducible")
			assert.Equal(t, "v0.0.0-test", cf.Config.Labels["org.opencontainers.image.version"])

			layers, err := got.Layers()
			require.NoError(t, err)
			assert.Len(t, layers, 1, "one layer: the binary on an empty base")

			entries := flatten(t, got)
			assert.Equal(t, bin, entries[tc.wantPath[1:]].data, "the image holds exactly the binary that was built")
			for path, e := range entries {
				assert.Zero(t, e.uid, "%s is owned by root so the process cannot replace it", path)
				assert.Equal(t, epoch, e.mtime.UTC(), "%s has the fixed time", path)
			}
		})
	}
}

type entry struct {
	data  []byte
	uid   int
	mtime time.Time
}

// flatten returns every entry of the image's filesystem by path, as a
// container runtime would unpack it.
func flatten(t *testing.T, img v1.Image) map[string]entry {
	t.Helper()
	rc := mutate.Extract(img)
	defer func() { _ = rc.Close() }()
	tr := tar.NewReader(rc)
	out := map[string]entry{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		require.NoError(t, err)
		data, err := io.ReadAll(tr)
		require.NoError(t, err)
		out[h.Name] = entry{data: data, uid: h.Uid, mtime: h.ModTime}
	}
}

// TestBuildIsReproducible pins that the same binary and time give the same
// digest, which is what lets the provider package pin the hub by digest.
func TestBuildIsReproducible(t *testing.T) {
	bin := []byte("#!not really a binary\n")
	digest := func(created time.Time) string {
		img, err := ociimage.Build(ociimage.Hub, bin, ociimage.Platform{OS: "linux", Arch: "amd64"}, created)
		require.NoError(t, err)
		d, err := img.Digest()
		require.NoError(t, err)
		return d.String()
	}
	assert.Equal(t, digest(epoch), digest(epoch))
	assert.NotEqual(t, digest(epoch), digest(epoch.Add(time.Second)), "the time is part of the image")
}
