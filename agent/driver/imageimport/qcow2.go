package imageimport

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"os"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
)

// A qcow2 image can name other files: a backing file its clusters fall
// through to, and an external data file holding its data. QEMU opens them
// on the node, so a downloaded image naming one would hand a tenant any
// file of the node. Before an image is used its header is read here, and an
// image naming either is refused. A raw image has no header and names
// nothing; one that is really qcow2 is refused too, since the guest would
// see the qcow2 structure as its disk.

// qcow2Magic starts every qcow2 image.
var qcow2Magic = []byte{'Q', 'F', 'I', 0xfb}

// Offsets and values of the qcow2 header (QEMU's docs/interop/qcow2.txt).
const (
	qcow2VersionOffset        = 4
	qcow2BackingOffset        = 8
	qcow2ClusterBitsOffset    = 20
	qcow2V2HeaderLength       = 72
	qcow2IncompatibleOffset   = 72
	qcow2HeaderLengthOffset   = 100
	qcow2V3MinHeaderLength    = 104
	qcow2ExternalDataFileBit  = 1 << 2
	qcow2ExtensionEnd         = 0x00000000
	qcow2ExtensionDataFile    = 0x44415441
	qcow2ExtensionBackingType = 0xe2792aca
	qcow2MinClusterBits       = 9
	qcow2MaxClusterBits       = 21
)

// UnsafeImageError is an image refused for what its content is or names.
type UnsafeImageError struct {
	Reason string
}

func (*UnsafeImageError) refused() {}

func (e *UnsafeImageError) Error() string { return e.Reason }

func unsafeImage(format string, args ...any) error {
	return &UnsafeImageError{Reason: fmt.Sprintf(format, args...)}
}

// Inspect checks the image file at path against its declared format,
// qcow2 or raw, and returns an UnsafeImageError for one the node must not
// use (IsRefusal).
func Inspect(path, format string) error {
	f, err := os.Open(path) //nolint:gosec // the caller's image file
	if err != nil {
		return errors.Wrap(err, "cannot open the image file")
	}
	defer f.Close() //nolint:errcheck // read-only
	// The header and its extensions lie within the first cluster, at most
	// 2 MiB; what is past the end of a short file reads as absent.
	head := make([]byte, 1<<qcow2MaxClusterBits)
	n, err := io.ReadFull(f, head)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		return errors.Wrap(err, "cannot read the image file")
	}
	return inspectHeader(head[:n], format)
}

// inspectHeader checks head, the start of an image, against its declared
// format.
func inspectHeader(head []byte, format string) error {
	isQcow2 := bytes.HasPrefix(head, qcow2Magic)
	switch format {
	case "raw":
		if isQcow2 {
			return unsafeImage("image declared raw is a qcow2 image: refused; declare its format qcow2")
		}
		return nil
	case "qcow2":
		if !isQcow2 {
			return unsafeImage("image declared qcow2 is not a qcow2 image (no qcow2 magic): refused")
		}
		return inspectQcow2(head)
	default:
		return unsafeImage("image format %q is not qcow2 or raw: refused", format)
	}
}

// inspectQcow2 refuses a qcow2 header that names a backing file or an
// external data file, or that it cannot read.
func inspectQcow2(head []byte) error {
	if len(head) < qcow2V2HeaderLength {
		return unsafeImage("qcow2 image header is truncated: refused")
	}
	be := binary.BigEndian
	version := be.Uint32(head[qcow2VersionOffset:])
	if version != 2 && version != 3 {
		return unsafeImage("qcow2 image has version %d, not 2 or 3: refused", version)
	}
	if be.Uint64(head[qcow2BackingOffset:]) != 0 {
		return unsafeImage("qcow2 image names a backing file: refused")
	}
	clusterBits := be.Uint32(head[qcow2ClusterBitsOffset:])
	if clusterBits < qcow2MinClusterBits || clusterBits > qcow2MaxClusterBits {
		return unsafeImage("qcow2 image has cluster_bits %d: refused", clusterBits)
	}
	extensions := qcow2V2HeaderLength
	if version == 3 {
		if len(head) < qcow2V3MinHeaderLength {
			return unsafeImage("qcow2 image header is truncated: refused")
		}
		if be.Uint64(head[qcow2IncompatibleOffset:])&qcow2ExternalDataFileBit != 0 {
			return unsafeImage("qcow2 image uses an external data file: refused")
		}
		extensions = int(be.Uint32(head[qcow2HeaderLengthOffset:]))
		if extensions < qcow2V3MinHeaderLength {
			return unsafeImage("qcow2 image has header_length %d: refused", extensions)
		}
	}
	return inspectQcow2Extensions(head[:min(len(head), 1<<clusterBits)], extensions)
}

// inspectQcow2Extensions walks the header extensions from offset off to
// their end marker, which must lie within head (the first cluster).
func inspectQcow2Extensions(head []byte, off int) error {
	be := binary.BigEndian
	for {
		if off+8 > len(head) {
			return unsafeImage("qcow2 image header extensions run past the first cluster: refused")
		}
		typ, length := be.Uint32(head[off:]), int(be.Uint32(head[off+4:]))
		off += 8
		switch typ {
		case qcow2ExtensionEnd:
			return nil
		case qcow2ExtensionDataFile:
			return unsafeImage("qcow2 image names an external data file: refused")
		case qcow2ExtensionBackingType:
			return unsafeImage("qcow2 image names a backing file format: refused")
		}
		// Each extension's data is padded to a multiple of 8 bytes.
		off += (length + 7) &^ 7
	}
}
