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
func BindingKey(uid string) (string, error) {
	if err := ValidateToken("uid", uid); err != nil {
		return "", err
	}
	return bindingsToken + "." + uid, nil
}

// BindingUID is the uid whose record key is, and whether key is one.
func BindingUID(key string) (string, bool) {
	uid, ok := strings.CutPrefix(key, bindingsToken+".")
	return uid, ok && ValidateToken("uid", uid) == nil
}

// EncodeBindingRecord encodes r, stamped with ProtocolVersion.
func EncodeBindingRecord(r BindingRecord) ([]byte, error) { return encode(r) }

// DecodeBindingRecord decodes and validates a BindingRecord.
func DecodeBindingRecord(b []byte) (BindingRecord, error) {
	return decodeValid[BindingRecord]("binding record", b)
}
