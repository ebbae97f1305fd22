// Package diskimagetest makes disk images for tests that serve them to an
// agent: the agent inspects what it downloads, so an image declared qcow2
// must start with a qcow2 header, one without backing or data file.
package diskimagetest

import (
	"crypto/rand"
	"encoding/binary"
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
