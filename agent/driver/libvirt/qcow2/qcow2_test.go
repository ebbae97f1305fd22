package qcow2

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// qemu runs one of QEMU's tools (qemu-img, qemu-io) in dir, skipping the
// test where it is not installed.
func qemu(t *testing.T, dir, tool string, args ...string) []byte {
	t.Helper()
	bin, err := exec.LookPath(tool)
	if err != nil {
		t.Skipf("%s is not installed (Debian: qemu-utils, make deps); it makes the images these tests read", tool)
	}
	cmd := exec.Command(bin, args...) //nolint:gosec // the test's own arguments
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s %v: %s", tool, args, out)
	return out
}

// image makes a qcow2 image of size with qemu-img create's extra options,
// then runs each qemu-io command on it, and opens it.
func image(t *testing.T, size string, options string, commands ...string) (string, *Image) {
	t.Helper()
	dir := t.TempDir()
	args := []string{"create", "-f", "qcow2"}
	if options != "" {
		args = append(args, "-o", options)
	}
	qemu(t, dir, "qemu-img", append(args, "disk.qcow2", size)...)
	if len(commands) > 0 {
		io := []string{"-f", "qcow2"}
		for _, c := range commands {
			io = append(io, "-c", c)
		}
		qemu(t, dir, "qemu-io", append(io, "disk.qcow2")...)
	}
	path := filepath.Join(dir, "disk.qcow2")
	f, err := os.Open(path) //nolint:gosec // the test's own image
	require.NoError(t, err)
	t.Cleanup(func() { _ = f.Close() })
	im, err := Open(f)
	require.NoError(t, err)
	return path, im
}

// qemuMap is what qemu-img map says the image holds, as extents.
func qemuMap(t *testing.T, path string) []Extent {
	t.Helper()
	var entries []struct {
		Start, Length       int64
		Present, Zero, Data bool
		Offset              *int64
	}
	out := qemu(t, filepath.Dir(path), "qemu-img", "map", "--output=json", path)
	require.NoError(t, json.Unmarshal(out, &entries), "%s", out)
	var exts []Extent
	for _, e := range entries {
		switch {
		case e.Data:
			require.NotNil(t, e.Offset, "data has an offset: %s", out)
			exts = appendMerged(exts, Extent{Offset: e.Start, Length: e.Length, Kind: Data, HostOffset: *e.Offset})
		case e.Zero && e.Present:
			exts = appendMerged(exts, Extent{Offset: e.Start, Length: e.Length, Kind: Zero})
		}
	}
	return exts
}

// TestMapAgreesWithQemuImg reads images qemu-io wrote to and compares
// their extents with qemu-img map's, and their data with qemu-img
// convert's raw copy.
func TestMapAgreesWithQemuImg(t *testing.T) {
	for name, tc := range map[string]struct {
		size, options string
		commands      []string
		want          []Extent
	}{
		"AnEmptyImageHoldsNothing": {size: "16M"},
		"WrittenDataAndAZeroedRange": {
			size:     "16M",
			commands: []string{"write -P 0xaa 1M 64k", "write -z 5M 128k"},
			want: []Extent{
				{Offset: 1 << 20, Length: 64 << 10, Kind: Data},
				{Offset: 5 << 20, Length: 128 << 10, Kind: Zero},
			},
		},
		"DataZeroedAfterKeepsItsClusterAsAZeroCluster": {
			size:     "16M",
			commands: []string{"write -P 0x11 2M 256k", "write -z 2M 64k", "write -z -u 2240k 64k", "write -z -u 3M 64k"},
			want: []Extent{
				{Offset: 2 << 20, Length: 64 << 10, Kind: Zero},
				{Offset: 2<<20 + 64<<10, Length: 128 << 10, Kind: Data},
				{Offset: 2<<20 + 192<<10, Length: 64 << 10, Kind: Zero},
				{Offset: 3 << 20, Length: 64 << 10, Kind: Zero},
			},
		},
		"SmallClustersSpanManyL2Tables": {
			size:     "16M",
			options:  "cluster_size=4096",
			commands: []string{"write -P 0xbb 1M 7M", "write -z 9M 3M", "write -P 0xcc 15M 4k"},
			want: []Extent{
				{Offset: 1 << 20, Length: 7 << 20, Kind: Data},
				{Offset: 9 << 20, Length: 3 << 20, Kind: Zero},
				{Offset: 15 << 20, Length: 4 << 10, Kind: Data},
			},
		},
		"ThePartialLastClusterEndsAtTheDisksEnd": {
			size:     "16777728", // 16 MiB and 512 bytes
			commands: []string{"write -P 0xdd 16M 512"},
			want:     []Extent{{Offset: 16 << 20, Length: 512, Kind: Data}},
		},
		"DataWrittenOutOfOrderIsHandedInGuestOrder": {
			size:     "8M",
			commands: []string{"write -P 0x01 3M 64k", "write -P 0x02 1M 64k", "write -P 0x03 1088k 64k", "write -P 0x04 2M 64k"},
			want: []Extent{
				{Offset: 1 << 20, Length: 128 << 10, Kind: Data},
				{Offset: 2 << 20, Length: 64 << 10, Kind: Data},
				{Offset: 3 << 20, Length: 64 << 10, Kind: Data},
			},
		},
	} {
		t.Run(name, func(t *testing.T) {
			path, im := image(t, tc.size, tc.options, tc.commands...)
			got, err := im.Map()
			require.NoError(t, err)
			assert.Equal(t, qemuMap(t, path), got, "as qemu-img map says")
			assert.Equal(t, tc.want, ranges(got), "what was written")

			raw := filepath.Join(filepath.Dir(path), "disk.raw")
			qemu(t, filepath.Dir(path), "qemu-img", "convert", "-O", "raw", path, raw)
			whole, err := os.ReadFile(raw) //nolint:gosec // the test's own file
			require.NoError(t, err)
			require.Len(t, whole, int(im.Size()))
			most := 3 * int(im.ClusterSize())
			var last int64
			err = im.Read(got, most, func(off int64, p []byte) error {
				assert.GreaterOrEqual(t, off, last, "in increasing offset")
				assert.LessOrEqual(t, len(p), most)
				assert.Equal(t, whole[off:off+int64(len(p))], p, "the data at %d", off)
				last = off + int64(len(p))
				return nil
			}, func(off, length int64) error {
				assert.GreaterOrEqual(t, off, last, "in increasing offset")
				assert.Equal(t, make([]byte, length), whole[off:off+length], "zeros at %d", off)
				last = off + length
				return nil
			})
			require.NoError(t, err)
		})
	}
}

// ranges is exts without their host offsets, merged as the guest sees
// them.
func ranges(exts []Extent) []Extent {
	var out []Extent
	for _, e := range exts {
		if n := len(out); n > 0 && out[n-1].Kind == e.Kind && out[n-1].End() == e.Offset {
			out[n-1].Length += e.Length
			continue
		}
		e.HostOffset = 0
		out = append(out, e)
	}
	return out
}

// TestReadMergesGuestContiguousDataUpToItsMost hands data that is
// contiguous on the guest disk but not in the image in one call, and no
// call larger than asked.
func TestReadMergesGuestContiguousDataUpToItsMost(t *testing.T) {
	// Written backwards, the clusters lie in the image in the opposite
	// order.
	var commands []string
	for i := 7; i >= 0; i-- {
		commands = append(commands, fmt.Sprintf("write -P %#x %dk 64k", 0x10+i, 1024+64*i))
	}
	_, im := image(t, "4M", "", commands...)
	exts, err := im.Map()
	require.NoError(t, err)
	require.Len(t, exts, 8, "no two clusters are contiguous in the image")
	type call struct{ off, n int64 }
	var calls []call
	read := func(most int) {
		calls = nil
		require.NoError(t, im.Read(exts, most, func(off int64, p []byte) error {
			for i := range len(p) / (64 << 10) {
				assert.Equal(t, byte(0x10+(off-1<<20)/(64<<10)+int64(i)), p[i*64<<10], "cluster %d of the call at %d", i, off)
			}
			calls = append(calls, call{off, int64(len(p))})
			return nil
		}, nil))
	}
	read(1 << 20)
	assert.Equal(t, []call{{1 << 20, 512 << 10}}, calls, "one call for the guest's one range")
	read(192 << 10)
	assert.Equal(t, []call{{1 << 20, 192 << 10}, {1<<20 + 192<<10, 192 << 10}, {1<<20 + 384<<10, 128 << 10}}, calls, "calls of at most 192 KiB")
	read(100 << 10)
	assert.Len(t, calls, 8, "a most below a cluster is a cluster")
}

// TestReadsAreBounded asks the image for no more than the read size at
// once, and reads a fresh image's L2 tables in one read.
func TestReadsAreBounded(t *testing.T) {
	path, _ := image(t, "64M", "cluster_size=4096", "write -P 0x5a 0 20M", "write -P 0x5b 40M 4k")
	f, err := os.Open(path) //nolint:gosec // the test's own image
	require.NoError(t, err)
	defer f.Close() //nolint:errcheck // read-only
	r := &countingReader{r: f}
	im, err := Open(r)
	require.NoError(t, err)
	im.SetReadSize(1 << 20)
	exts, err := im.Map()
	require.NoError(t, err)
	assert.LessOrEqual(t, r.largest, 1<<20)
	tables := r.reads - 2 // the header, the L1 table
	assert.Less(t, tables, 16, "the 11 L2 tables (and their neighbours) are read in a few reads, not one each")
	r.reads, r.largest = 0, 0
	require.NoError(t, im.Read(exts, 8<<20, func(int64, []byte) error { return nil }, nil))
	assert.LessOrEqual(t, r.largest, 1<<20)
}

type countingReader struct {
	r              *os.File
	reads, largest int
}

func (c *countingReader) ReadAt(p []byte, off int64) (int, error) {
	c.reads++
	c.largest = max(c.largest, len(p))
	return c.r.ReadAt(p, off)
}

// TestImagesItDoesNotReadAreRefused refuses, with an error that says why,
// what this reader would read wrong.
func TestImagesItDoesNotReadAreRefused(t *testing.T) {
	dir := t.TempDir()
	qemu(t, dir, "qemu-img", "create", "-f", "qcow2", "base.qcow2", "4M")
	qemu(t, dir, "qemu-img", "create", "-f", "qcow2", "-o", "compat=0.10", "v2.qcow2", "4M")
	qemu(t, dir, "qemu-img", "create", "-f", "qcow2", "-b", "base.qcow2", "-F", "qcow2", "overlay.qcow2")
	qemu(t, dir, "qemu-img", "create", "-f", "qcow2", "-o", "data_file=data.raw", "external.qcow2", "4M")
	qemu(t, dir, "qemu-img", "create", "-f", "qcow2", "-o", "extended_l2=on", "subclusters.qcow2", "4M")
	qemu(t, dir, "qemu-io", "-f", "qcow2", "-c", "write -P 0x42 0 1M", "base.qcow2")
	qemu(t, dir, "qemu-img", "convert", "-c", "-O", "qcow2", "base.qcow2", "compressed.qcow2")
	require.NoError(t, os.WriteFile(filepath.Join(dir, "raw.img"), make([]byte, 1<<20), 0o600))
	open := func(name string) (*Image, error) {
		b, err := os.ReadFile(filepath.Join(dir, name)) //nolint:gosec // the test's own file
		require.NoError(t, err)
		return Open(bytes.NewReader(b))
	}

	for name, tc := range map[string]struct{ file, wantErr string }{
		"NotQcow2":           {"raw.img", "not a qcow2 image (no qcow2 magic)"},
		"Version2":           {"v2.qcow2", "qcow2 version 2 is not read, only version 3"},
		"ABackingFile":       {"overlay.qcow2", "the qcow2 image names a backing file, which is not read"},
		"AnExternalDataFile": {"external.qcow2", "the qcow2 image has an external data file, which is not read"},
		"ExtendedL2Entries":  {"subclusters.qcow2", "the qcow2 image has extended L2 entries (subclusters), which are not read"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := open(tc.file)
			assert.EqualError(t, err, tc.wantErr)
		})
	}
	t.Run("ACompressedClusterWhenMet", func(t *testing.T) {
		im, err := open("compressed.qcow2")
		require.NoError(t, err)
		_, err = im.Map()
		assert.EqualError(t, err, "the qcow2 image has a compressed cluster at guest offset 0, which is not read")
	})

	base, err := os.ReadFile(filepath.Join(dir, "base.qcow2"))
	require.NoError(t, err)
	for name, tc := range map[string]struct {
		edit    func(h []byte)
		wantErr string
	}{
		"MarkedCorrupt":             {func(h []byte) { h[79] |= incompatCorrupt }, "the qcow2 image is marked corrupt"},
		"UnknownIncompatibleBits":   {func(h []byte) { h[78] |= 1 }, "the qcow2 image has unknown incompatible features 0x100"},
		"Encrypted":                 {func(h []byte) { binary.BigEndian.PutUint32(h[32:], 2) }, "the qcow2 image is encrypted (crypt_method 2), which is not read"},
		"AnL1TableTooSmallForASize": {func(h []byte) { binary.BigEndian.PutUint64(h[24:], 1<<40) }, "the qcow2 image's L1 table has 1 entries; its size needs 2048"},
		"ClustersTooLarge":          {func(h []byte) { binary.BigEndian.PutUint32(h[20:], 22) }, "the qcow2 image has cluster_bits 22"},
	} {
		t.Run(name, func(t *testing.T) {
			h := bytes.Clone(base)
			tc.edit(h)
			_, err := Open(bytes.NewReader(h))
			assert.EqualError(t, err, tc.wantErr)
		})
	}
	t.Run("ATruncatedImage", func(t *testing.T) {
		im, err := Open(bytes.NewReader(base[:3<<16]))
		require.NoError(t, err, "the header is there")
		exts, err := im.Map()
		if err == nil {
			err = im.Read(exts, 1<<20, func(int64, []byte) error { return nil }, nil)
		}
		assert.ErrorContains(t, err, "EOF")
	})
}
