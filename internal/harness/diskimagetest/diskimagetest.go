// Package diskimagetest makes disk images for tests that serve them to an
// agent: the agent inspects what it downloads, so an image declared qcow2
// must start with a qcow2 header, one without backing or data file.
package diskimagetest

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// qcow2HeaderLength is the length of a qcow2 version 3 header without
// optional fields.
const qcow2HeaderLength = 104

// QCOW2Header is the header of an empty qcow2 version 3 image of 1 GiB
// with 64 KiB clusters, followed by the end of its header extensions.
func QCOW2Header() []byte {
	h := make([]byte, qcow2HeaderLength+8)
	be := binary.BigEndian
	copy(h, "QFI\xfb")
	be.PutUint32(h[4:], 3)      // version
	be.PutUint32(h[20:], 16)    // cluster_bits
	be.PutUint64(h[24:], 1<<30) // size
	be.PutUint32(h[96:], 4)     // refcount_order
	be.PutUint32(h[100:], qcow2HeaderLength)
	return h
}

// QCOW2 is size bytes: a qcow2 header, then random bytes, which libvirt's
// test driver never reads.
func QCOW2(size int) []byte {
	b := make([]byte, size)
	_, _ = rand.Read(b)
	copy(b, QCOW2Header())
	return b
}

// Marked is a real qcow2 image of a disk of size bytes that is all zeros
// but for marker at offset, converted by qemu-img from the raw disk, so a
// backend that reads images (Cinder's qemu-img convert, CDI) finds the
// marker where a guest would. It needs qemu-img (qemu-utils) on the PATH.
func Marked(dir string, size, offset int64, marker []byte) ([]byte, error) {
	raw := filepath.Join(dir, "marked.raw")
	qcow2 := filepath.Join(dir, "marked.qcow2")
	f, err := os.Create(raw)
	if err != nil {
		return nil, err
	}
	_, err = f.WriteAt(marker, offset)
	if err == nil {
		err = f.Truncate(size)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, err
	}
	if out, err := exec.Command("qemu-img", "convert", "-f", "raw", "-O", "qcow2", raw, qcow2).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("qemu-img convert: %w: %s", err, out)
	}
	return os.ReadFile(qcow2)
}
