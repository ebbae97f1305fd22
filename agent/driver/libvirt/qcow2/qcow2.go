// Package qcow2 reads which guest ranges a qcow2 image holds, and their
// data, from its L1 and L2 tables (QEMU's docs/interop/qcow2.txt), through
// an io.ReaderAt: the libvirt driver reads a backup's target image this way,
// over libvirt's volume download, never as a file of the node.
//
// Only the images QEMU writes for a backup are read: version 3, no backing
// file, no encryption, no external data file, no extended L2 entries; a
// compressed cluster is an error when met. Anything else is refused with an
// error rather than read wrong.
package qcow2

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"io"
	"slices"
)

// Kind says what an extent of the guest disk holds.
type Kind uint8

const (
	// Data: the extent's bytes are in the image, at HostOffset.
	Data Kind = iota + 1
	// Zero: the extent reads as zeros, written so (a zero cluster),
	// whether or not the image allocated it.
	Zero
)

func (k Kind) String() string {
	switch k {
	case Data:
		return "data"
	case Zero:
		return "zero"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// Extent is a range of the guest disk the image holds. A range no extent
// covers is unallocated: the image says nothing of it.
type Extent struct {
	Offset, Length int64
	Kind           Kind
	// HostOffset is where a Data extent's bytes start in the image.
	HostOffset int64
}

// End is where the extent ends on the guest disk.
func (e Extent) End() int64 { return e.Offset + e.Length }

// Header fields and flags (docs/interop/qcow2.txt).
const (
	headerV3Length          = 104
	minClusterBits          = 9
	maxClusterBits          = 21
	incompatDirty           = 1 << 0
	incompatCorrupt         = 1 << 1
	incompatExternalData    = 1 << 2
	incompatCompressionType = 1 << 3
	incompatExtendedL2      = 1 << 4
	// offsetMask keeps bits 9-55 of an L1 or L2 entry: an offset in the
	// image.
	offsetMask     = 0x00fffffffffffe00
	l2Compressed   = 1 << 62
	l2ZeroFlag     = 1 << 0
	l2ReservedBits = 0x3f000000000001fe
	l1ReservedBits = 0x7f000000000001ff
	// maxL1Entries bounds the L1 table read (32 MiB, QEMU's own limit).
	maxL1Entries = 32 << 20 / 8
)

var magic = []byte{'Q', 'F', 'I', 0xfb}

// Image is an open qcow2 image.
type Image struct {
	r           io.ReaderAt
	size        int64
	clusterBits uint
	l1Offset    int64
	l1Entries   int
	// readSize is the most bytes one read asks of r.
	readSize int
}

// DefaultReadSize is how many bytes one read asks of the image at most,
// unless Open is told otherwise: one libvirt stream per 4 MiB is cheap,
// one per 64 KiB cluster is not.
const DefaultReadSize = 4 << 20

// Open reads the header of the image r and refuses an image this package
// does not read.
func Open(r io.ReaderAt) (*Image, error) {
	h := make([]byte, headerV3Length)
	if _, err := r.ReadAt(h, 0); err != nil {
		return nil, fmt.Errorf("cannot read the qcow2 header: %w", err)
	}
	be := binary.BigEndian
	if string(h[:4]) != string(magic) {
		return nil, fmt.Errorf("not a qcow2 image (no qcow2 magic)")
	}
	if v := be.Uint32(h[4:]); v != 3 {
		return nil, fmt.Errorf("qcow2 version %d is not read, only version 3", v)
	}
	if be.Uint64(h[8:]) != 0 {
		return nil, fmt.Errorf("the qcow2 image names a backing file, which is not read")
	}
	bits := be.Uint32(h[20:])
	if bits < minClusterBits || bits > maxClusterBits {
		return nil, fmt.Errorf("the qcow2 image has cluster_bits %d", bits)
	}
	size := be.Uint64(h[24:])
	if size > 1<<62 {
		return nil, fmt.Errorf("the qcow2 image has size %d", size)
	}
	if m := be.Uint32(h[32:]); m != 0 {
		return nil, fmt.Errorf("the qcow2 image is encrypted (crypt_method %d), which is not read", m)
	}
	switch incompat := be.Uint64(h[72:]); {
	case incompat&incompatCorrupt != 0:
		return nil, fmt.Errorf("the qcow2 image is marked corrupt")
	case incompat&incompatExternalData != 0:
		return nil, fmt.Errorf("the qcow2 image has an external data file, which is not read")
	case incompat&incompatExtendedL2 != 0:
		return nil, fmt.Errorf("the qcow2 image has extended L2 entries (subclusters), which are not read")
	case incompat&^(incompatDirty|incompatCompressionType) != 0:
		// Dirty only says the refcounts may be stale, which the map does
		// not read; a compression type only matters to compressed
		// clusters, which are refused when met.
		return nil, fmt.Errorf("the qcow2 image has unknown incompatible features %#x", incompat)
	}
	im := &Image{
		r:           r,
		size:        int64(size), //nolint:gosec // bounded above
		clusterBits: uint(bits),
		l1Offset:    int64(be.Uint64(h[40:])), //nolint:gosec // checked below
		l1Entries:   int(be.Uint32(h[36:])),
		readSize:    DefaultReadSize,
	}
	need := (im.size + im.l2Span() - 1) / im.l2Span()
	switch {
	case im.l1Entries > maxL1Entries:
		return nil, fmt.Errorf("the qcow2 image has an L1 table of %d entries", im.l1Entries)
	case int64(im.l1Entries) < need:
		return nil, fmt.Errorf("the qcow2 image's L1 table has %d entries; its size needs %d", im.l1Entries, need)
	case im.l1Entries > 0 && (im.l1Offset <= 0 || im.l1Offset%im.ClusterSize() != 0):
		return nil, fmt.Errorf("the qcow2 image's L1 table is at offset %d", im.l1Offset)
	}
	return im, nil
}

// SetReadSize sets how many bytes one read asks of the image at most; at
// least a cluster.
func (im *Image) SetReadSize(n int) { im.readSize = max(n, int(im.ClusterSize())) }

// Size is the guest disk's size in bytes.
func (im *Image) Size() int64 { return im.size }

// ClusterSize is the image's cluster size in bytes: the granularity of
// its extents.
func (im *Image) ClusterSize() int64 { return 1 << im.clusterBits }

// l2Entries is how many entries an L2 table has; l2Span how much of the
// guest disk one table maps.
func (im *Image) l2Entries() int64 { return im.ClusterSize() / 8 }
func (im *Image) l2Span() int64    { return im.l2Entries() * im.ClusterSize() }

// Map reads the image's L1 and L2 tables and returns its extents in
// increasing guest offset: Data extents merged where they are contiguous on
// the guest disk and in the image, Zero extents where they are contiguous
// on the guest disk.
func (im *Image) Map() ([]Extent, error) {
	l1, err := im.readTable(im.l1Offset, im.l1Entries)
	if err != nil {
		return nil, fmt.Errorf("cannot read the qcow2 L1 table: %w", err)
	}
	// The L2 tables a disk needs, read in runs that are contiguous in the
	// image, so that a fresh image's tables cost a read or two.
	type table struct {
		index int
		host  int64
	}
	var tables []table
	for i, e := range l1[:min(len(l1), int((im.size+im.l2Span()-1)/im.l2Span()))] {
		if e&l1ReservedBits != 0 {
			return nil, fmt.Errorf("qcow2 L1 entry %d has reserved bits set (%#x)", i, e)
		}
		if host := int64(e & offsetMask); host != 0 {
			tables = append(tables, table{index: i, host: host})
		}
	}
	slices.SortFunc(tables, func(a, b table) int { return cmp.Compare(a.host, b.host) })
	perTable := make([][]Extent, len(l1))
	cluster := im.ClusterSize()
	for start := 0; start < len(tables); {
		end := start + 1
		for end < len(tables) && tables[end].host == tables[end-1].host+cluster && int64(end-start+1)*cluster <= int64(im.readSize) {
			end++
		}
		entries, err := im.readTable(tables[start].host, (end-start)*int(im.l2Entries()))
		if err != nil {
			return nil, fmt.Errorf("cannot read qcow2 L2 tables at offset %d: %w", tables[start].host, err)
		}
		for k, t := range tables[start:end] {
			n := int(im.l2Entries())
			if perTable[t.index], err = im.extentsOf(t.index, entries[k*n:(k+1)*n]); err != nil {
				return nil, err
			}
		}
		start = end
	}
	var out []Extent
	for _, exts := range perTable {
		for _, e := range exts {
			out = appendMerged(out, e)
		}
	}
	return out, nil
}

// extentsOf reads the L2 table of L1 entry index.
func (im *Image) extentsOf(index int, entries []uint64) ([]Extent, error) {
	cluster := im.ClusterSize()
	var out []Extent
	for j, e := range entries {
		off := int64(index)*im.l2Span() + int64(j)*cluster
		if off >= im.size {
			break
		}
		length := min(cluster, im.size-off)
		host := int64(e & offsetMask)
		switch {
		case e&l2Compressed != 0:
			return nil, fmt.Errorf("the qcow2 image has a compressed cluster at guest offset %d, which is not read", off)
		case e&l2ReservedBits != 0:
			return nil, fmt.Errorf("qcow2 L2 entry for guest offset %d has reserved bits set (%#x)", off, e)
		case e&l2ZeroFlag != 0:
			out = appendMerged(out, Extent{Offset: off, Length: length, Kind: Zero})
		case host != 0:
			if host%cluster != 0 {
				return nil, fmt.Errorf("qcow2 L2 entry for guest offset %d points at unaligned offset %d", off, host)
			}
			out = appendMerged(out, Extent{Offset: off, Length: length, Kind: Data, HostOffset: host})
		}
	}
	return out, nil
}

// appendMerged appends e to out, merged into out's last extent where the
// two are one range.
func appendMerged(out []Extent, e Extent) []Extent {
	if n := len(out); n > 0 {
		last := &out[n-1]
		if last.Kind == e.Kind && last.End() == e.Offset && (e.Kind != Data || last.HostOffset+last.Length == e.HostOffset) {
			last.Length += e.Length
			return out
		}
	}
	return append(out, e)
}

// readTable reads n big-endian 64-bit entries at offset off.
func (im *Image) readTable(off int64, n int) ([]uint64, error) {
	b := make([]byte, n*8)
	if err := im.readFull(b, off); err != nil {
		return nil, err
	}
	out := make([]uint64, n)
	for i := range out {
		out[i] = binary.BigEndian.Uint64(b[i*8:])
	}
	return out, nil
}

// readFull fills p from offset off of the image, in reads of at most
// readSize.
func (im *Image) readFull(p []byte, off int64) error {
	for len(p) > 0 {
		n := min(len(p), im.readSize)
		if _, err := im.r.ReadAt(p[:n], off); err != nil {
			return err
		}
		p, off = p[n:], off+int64(n)
	}
	return nil
}

// Read hands the guest ranges extents (from Map) hold, in increasing
// offset: data gets the bytes of each run of Data extents that are
// contiguous on the guest disk, at most most bytes a call (rounded down to
// whole clusters; p is Read's, only valid during the call); zero, where not
// nil, gets each run of Zero extents.
func (im *Image) Read(extents []Extent, most int, data func(off int64, p []byte) error, zero func(off, length int64) error) error {
	most = int(cmp.Or(int64(most)/im.ClusterSize(), 1) * im.ClusterSize())
	buf := make([]byte, 0, most)
	var runOff int64
	flush := func() error {
		if len(buf) == 0 {
			return nil
		}
		err := data(runOff, buf)
		buf = buf[:0]
		return err
	}
	for _, e := range extents {
		if e.Kind == Zero {
			if err := flush(); err != nil {
				return err
			}
			if zero != nil {
				if err := zero(e.Offset, e.Length); err != nil {
					return err
				}
			}
			continue
		}
		for done := int64(0); done < e.Length; {
			if len(buf) > 0 && (runOff+int64(len(buf)) != e.Offset+done || len(buf) == most) {
				if err := flush(); err != nil {
					return err
				}
			}
			if len(buf) == 0 {
				runOff = e.Offset + done
			}
			n := min(e.Length-done, int64(most-len(buf)))
			p := buf[len(buf) : len(buf)+int(n)]
			if err := im.readFull(p, e.HostOffset+done); err != nil {
				return fmt.Errorf("cannot read guest offset %d of the qcow2 image: %w", e.Offset+done, err)
			}
			buf, done = buf[:len(buf)+int(n)], done+n
		}
	}
	return flush()
}
