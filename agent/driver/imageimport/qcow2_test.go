package imageimport

import (
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/virtfleet/virtfleet/internal/harness/diskimagetest"
)

// qemuImg runs qemu-img in dir, skipping the test where it is not installed.
func qemuImg(t *testing.T, dir string, args ...string) {
	t.Helper()
	bin, err := exec.LookPath("qemu-img")
	if err != nil {
		t.Skip("qemu-img is not installed (Debian: qemu-utils); it makes the images these tests inspect")
	}
	cmd := exec.Command(bin, args...) //nolint:gosec // the test's own arguments
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "qemu-img %v: %s", args, out)
}

// TestInspectImagesMadeByQemuImg inspects images as QEMU's own tool makes
// them: only a qcow2 that names no other file passes as qcow2.
func TestInspectImagesMadeByQemuImg(t *testing.T) {
	dir := t.TempDir()
	qemuImg(t, dir, "create", "-f", "qcow2", "base.qcow2", "1M")
	qemuImg(t, dir, "create", "-f", "qcow2", "-b", "base.qcow2", "-F", "qcow2", "top.qcow2")
	qemuImg(t, dir, "create", "-f", "qcow2", "-o", "compat=0.10", "-b", "base.qcow2", "-F", "qcow2", "top-v2.qcow2")
	qemuImg(t, dir, "create", "-f", "qcow2", "-o", "data_file=data.raw,data_file_raw=on", "external.qcow2", "1M")
	qemuImg(t, dir, "create", "-f", "raw", "plain.raw", "1M")

	cases := map[string]struct {
		file, format string
		wantErr      string
	}{
		"APlainQcow2IsAccepted":              {file: "base.qcow2", format: "qcow2"},
		"ARawImageIsAccepted":                {file: "plain.raw", format: "raw"},
		"ABackingFileIsRefused":              {file: "top.qcow2", format: "qcow2", wantErr: "qcow2 image names a backing file: refused"},
		"ABackingFileOfVersion2IsRefused":    {file: "top-v2.qcow2", format: "qcow2", wantErr: "qcow2 image names a backing file: refused"},
		"AnExternalDataFileIsRefused":        {file: "external.qcow2", format: "qcow2", wantErr: "qcow2 image uses an external data file: refused"},
		"RawDeclaredQcow2IsRefused":          {file: "plain.raw", format: "qcow2", wantErr: "image declared qcow2 is not a qcow2 image (no qcow2 magic): refused"},
		"Qcow2DeclaredRawIsRefused":          {file: "base.qcow2", format: "raw", wantErr: "image declared raw is a qcow2 image: refused; declare its format qcow2"},
		"AFormatNeitherQcow2NorRawIsRefused": {file: "base.qcow2", format: "vmdk", wantErr: `image format "vmdk" is not qcow2 or raw: refused`},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			err := Inspect(filepath.Join(dir, tc.file), tc.format)
			if tc.wantErr == "" {
				assert.NoError(t, err)
				return
			}
			require.EqualError(t, err, tc.wantErr)
			assert.True(t, IsRefusal(err), "no retry mends it")
		})
	}
}

// TestInspectQcow2Headers covers what qemu-img does not write: truncated
// or malformed headers, and a data file named only by its extension.
func TestInspectQcow2Headers(t *testing.T) {
	be := binary.BigEndian
	withExtension := func(typ uint32, data []byte) func([]byte) []byte {
		return func(h []byte) []byte {
			h = h[:qcow2V3MinHeaderLength]
			ext := make([]byte, 8, 8+len(data)+8+8)
			be.PutUint32(ext, typ)
			be.PutUint32(ext[4:], uint32(len(data))) //nolint:gosec // a short test string
			ext = append(ext, data...)
			ext = append(ext, make([]byte, (8-len(data)%8)%8)...)
			return append(append(h, ext...), make([]byte, 8)...)
		}
	}
	cases := map[string]struct {
		change  func(h []byte) []byte
		wantErr string
	}{
		"AMinimalHeaderIsAccepted": {change: func(h []byte) []byte { return h }},
		"AnUnknownExtensionIsSkipped": {
			change: withExtension(0x6803f857, []byte("feature table")),
		},
		"ADataFileExtensionIsRefused": {
			change:  withExtension(qcow2ExtensionDataFile, []byte("/etc/shadow")),
			wantErr: "qcow2 image names an external data file: refused",
		},
		"ABackingFormatExtensionIsRefused": {
			change:  withExtension(qcow2ExtensionBackingType, []byte("raw")),
			wantErr: "qcow2 image names a backing file format: refused",
		},
		"ATruncatedHeaderIsRefused": {
			change:  func(h []byte) []byte { return h[:40] },
			wantErr: "qcow2 image header is truncated: refused",
		},
		"AnUnknownVersionIsRefused": {
			change:  func(h []byte) []byte { be.PutUint32(h[qcow2VersionOffset:], 4); return h },
			wantErr: "qcow2 image has version 4, not 2 or 3: refused",
		},
		"ABadClusterSizeIsRefused": {
			change:  func(h []byte) []byte { be.PutUint32(h[qcow2ClusterBitsOffset:], 40); return h },
			wantErr: "qcow2 image has cluster_bits 40: refused",
		},
		"ExtensionsWithoutAnEndAreRefused": {
			change:  func(h []byte) []byte { return h[:qcow2V3MinHeaderLength+4] },
			wantErr: "qcow2 image header extensions run past the first cluster: refused",
		},
		"TheExternalDataFileBitIsRefused": {
			change:  func(h []byte) []byte { be.PutUint64(h[qcow2IncompatibleOffset:], qcow2ExternalDataFileBit); return h },
			wantErr: "qcow2 image uses an external data file: refused",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			err := inspectHeader(tc.change(diskimagetest.QCOW2Header()), "qcow2")
			if tc.wantErr == "" {
				assert.NoError(t, err)
				return
			}
			assert.EqualError(t, err, tc.wantErr)
		})
	}
}

// TestInspectImageReadsTheFile checks the file is what is read, up to its
// end, with a short file refused rather than read past.
func TestInspectImageReadsTheFile(t *testing.T) {
	dir := t.TempDir()
	short := filepath.Join(dir, "short")
	require.NoError(t, os.WriteFile(short, qcow2Magic, 0o600))
	assert.EqualError(t, Inspect(short, "qcow2"), "qcow2 image header is truncated: refused")
	whole := filepath.Join(dir, "whole")
	require.NoError(t, os.WriteFile(whole, diskimagetest.QCOW2Header(), 0o600))
	assert.NoError(t, Inspect(whole, "qcow2"))
}
