package v1alpha1

import (
	"errors"
	"strings"
)

// bindingsToken begins the key of every BindingRecord in BucketIntents. No
// node's keys can begin with it: a node token holds a capital letter only
// right after '_' (NodeToken), so no agent's permissions or watch reach a
// record, and only the hub, which writes intents, writes one.
const bindingsToken = "Bindings"

// BindingsFilter is the key filter of every BindingRecord.
const BindingsFilter = bindingsToken + ".>"

// BindingRecord is the hub's own record of the newest binding it sealed
// for a VirtualMachine: the node, the orphan it adopted and the epoch. It
// lives in BucketIntents under BindingKey(uid). The VM's status shows the
// binding too, but a tenant allowed to edit a VM may write its status as
// well; the hub trusts only this record.
type BindingRecord struct {
	ProtocolVersion int    `json:"protocolVersion"`
	UID             string `json:"uid"`
	Node            string `json:"node"`
	Adopted         string `json:"adopted,omitempty"`
	Epoch           int64  `json:"epoch"`
}

func (r *BindingRecord) stamp() { r.ProtocolVersion = ProtocolVersion }

// Validate refuses a record without a uid or node, or with a negative
// epoch.
func (r BindingRecord) Validate() error {
	if err := ValidateToken("uid", r.UID); err != nil {
		return err
	}
	if r.Node == "" {
		return errors.New("binding record has no node")
	}
	if r.Epoch < 0 {
		return errors.New("binding record has a negative epoch")
	}
	return nil
}

// BindingKey is the key of the BindingRecord of the VM of uid.
func BindingKey(uid string) (string, error) { return recordKey(bindingsToken, uid) }

// BindingUID is the uid whose record key is, and whether key is one.
func BindingUID(key string) (string, bool) { return recordUID(bindingsToken, key) }

// recordKey is the key of the hub's record under token of uid.
func recordKey(token, uid string) (string, error) {
	if err := ValidateToken("uid", uid); err != nil {
		return "", err
	}
	return token + "." + uid, nil
}

// recordUID is the uid whose record under token key is, and whether key is
// one.
func recordUID(token, key string) (string, bool) {
	uid, ok := strings.CutPrefix(key, token+".")
	return uid, ok && ValidateToken("uid", uid) == nil
}

// EncodeBindingRecord encodes r, stamped with ProtocolVersion.
func EncodeBindingRecord(r BindingRecord) ([]byte, error) { return encode(r) }

// DecodeBindingRecord decodes and validates a BindingRecord.
func DecodeBindingRecord(b []byte) (BindingRecord, error) {
	return decodeValid[BindingRecord]("binding record", b)
}

// sizesToken begins the key of every VolumeSizeRecord in BucketIntents; as
// bindingsToken, no node's keys can begin with it.
const sizesToken = "Sizes"

// VolumeSizeRecord is the hub's own record of the size in effect of a
// Volume: the size it admitted against its namespace's quota and sends its
// node. A Volume's spec may ask for more; the hub sends more only once it
// admitted the growth. It lives in BucketIntents under SizeKey(uid).
type VolumeSizeRecord struct {
	ProtocolVersion int    `json:"protocolVersion"`
	UID             string `json:"uid"`
	SizeBytes       int64  `json:"sizeBytes"`
}

func (r *VolumeSizeRecord) stamp() { r.ProtocolVersion = ProtocolVersion }

// Validate refuses a record without a uid or with a size not above zero.
func (r VolumeSizeRecord) Validate() error {
	if err := ValidateToken("uid", r.UID); err != nil {
		return err
	}
	if r.SizeBytes <= 0 {
		return errors.New("volume size record has no size")
	}
	return nil
}

// SizeKey is the key of the VolumeSizeRecord of the Volume of uid.
func SizeKey(uid string) (string, error) { return recordKey(sizesToken, uid) }

// SizeUID is the uid whose size record key is, and whether key is one.
func SizeUID(key string) (string, bool) { return recordUID(sizesToken, key) }

// EncodeVolumeSizeRecord encodes r, stamped with ProtocolVersion.
func EncodeVolumeSizeRecord(r VolumeSizeRecord) ([]byte, error) { return encode(r) }

// DecodeVolumeSizeRecord decodes and validates a VolumeSizeRecord.
func DecodeVolumeSizeRecord(b []byte) (VolumeSizeRecord, error) {
	return decodeValid[VolumeSizeRecord]("volume size record", b)
}
