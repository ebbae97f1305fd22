package driver

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"unicode"
	"unicode/utf8"
)

// MaxSerial is the longest serial a virtio-blk disk has (the virtio spec's
// VIRTIO_BLK_ID_BYTES): QEMU cuts a longer one, so two long names sharing
// their first 20 bytes would show the guest one serial.
const MaxSerial = 20

// DiskSerial is the serial of the disk on the volume named vol on the
// node, which the guest finds it by (/dev/disk/by-id/virtio-<serial> on
// virtio, scsi-0QEMU_QEMU_HARDDISK_<serial> on SCSI): the volume's name,
// which is the Volume's (namespace_name) and so the same at every
// definition, start, hot-plug and migration. A name too long, or with a
// character libvirt and KubeVirt refuse in a serial (an imported volume's
// may have any), keeps its start, those characters made '_', and ends with
// a hash of the whole, so different Volumes keep different serials.
func DiskSerial(vol string) string {
	safe := func(r rune) bool {
		return r < utf8.RuneSelf && (unicode.IsLetter(r) || unicode.IsDigit(r) || strings.ContainsRune("-_.+", r))
	}
	if len(vol) <= MaxSerial && strings.IndexFunc(vol, func(r rune) bool { return !safe(r) }) < 0 {
		return vol
	}
	sum := sha256.Sum256([]byte(vol))
	tail := hex.EncodeToString(sum[:4])
	head := []rune(strings.Map(func(r rune) rune {
		if safe(r) {
			return r
		}
		return '_'
	}, vol))
	return string(head[:min(len(head), MaxSerial-len(tail)-1)]) + "-" + tail
}
