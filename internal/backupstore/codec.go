package backupstore

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"hash"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
)

// KeySize is the size of a Location's Key.
const KeySize = 32

// codec names chunks and seals them. Without a key a chunk's name is the
// sha256 of its content and the content is stored as it is; with one the
// name is an HMAC, so names do not tell the store what it holds, and the
// content is sealed with AES-256-GCM, its name as additional data so a
// body moved under another name fails to open.
type codec struct {
	idKey       []byte // nil: not encrypted
	aead        cipher.AEAD
	fingerprint string
}

// Each use of the key gets its own key derived from it, so that no two
// uses can be played against each other.
const (
	infoID          = "virtfleet backupstore chunk id"
	infoSeal        = "virtfleet backupstore chunk seal"
	infoFingerprint = "virtfleet backupstore key fingerprint"
)

var plainCodec = &codec{}

func newCodec(key []byte) (*codec, error) {
	if key == nil {
		return plainCodec, nil
	}
	if len(key) != KeySize {
		return nil, errors.Errorf("backup key is %d bytes, want %d", len(key), KeySize)
	}
	derive := func(info string) []byte {
		k, err := hkdf.Key(sha256.New, key, nil, info, 32)
		if err != nil {
			panic(err) // only for a key length hkdf refuses, checked above
		}
		return k
	}
	block, err := aes.NewCipher(derive(infoSeal))
	if err != nil {
		return nil, errors.Wrap(err, "cannot make the chunk cipher")
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, errors.Wrap(err, "cannot make the chunk cipher")
	}
	return &codec{
		idKey:       derive(infoID),
		aead:        aead,
		fingerprint: hex.EncodeToString(derive(infoFingerprint)[:16]),
	}, nil
}

func (c *codec) encrypted() bool { return c.idKey != nil }

func (c *codec) hash() hash.Hash {
	if c.encrypted() {
		return hmac.New(sha256.New, c.idKey)
	}
	return sha256.New()
}

// id names a chunk of content p.
func (c *codec) id(p []byte) string {
	h := c.hash()
	h.Write(p)
	return hex.EncodeToString(h.Sum(nil))
}

// seal returns what the store holds for chunk id of content p; an
// encrypted backup's spec is sealed the same way, under its manifest's key.
func (c *codec) seal(id string, p []byte) []byte {
	if !c.encrypted() {
		return p
	}
	out := make([]byte, c.aead.NonceSize(), c.aead.NonceSize()+len(p)+c.aead.Overhead())
	if _, err := rand.Read(out); err != nil {
		panic(err) // crypto/rand never fails on Linux 3.17+
	}
	return c.aead.Seal(out, out, p, []byte(id))
}

// open returns the content of chunk id from what the store holds, or a
// *CorruptChunkError when body is not what seal made of content named id.
func (c *codec) open(id string, body []byte) ([]byte, error) {
	p := body
	if c.encrypted() {
		var err error
		if p, err = c.unseal(id, body); err != nil {
			return nil, &CorruptChunkError{Chunk: id, Reason: err.Error()}
		}
	}
	if got := c.id(p); subtle.ConstantTimeCompare([]byte(got), []byte(id)) != 1 {
		return nil, &CorruptChunkError{Chunk: id, Reason: "its content does not match its name"}
	}
	return p, nil
}

// unseal opens what seal made with additional data ad.
func (c *codec) unseal(ad string, body []byte) ([]byte, error) {
	n := c.aead.NonceSize()
	if len(body) < n+c.aead.Overhead() {
		return nil, errors.New("shorter than its seal")
	}
	p, err := c.aead.Open(nil, body[:n], body[n:], []byte(ad))
	if err != nil {
		return nil, errors.New("its seal does not open (authentication failed)")
	}
	return p, nil
}

// forManifest returns the codec that reads m, or ErrWrongKey when this
// store's key is not the one m was written under.
func (c *codec) forManifest(m Manifest) (*codec, error) {
	switch {
	case !m.Encrypted:
		return plainCodec, nil
	case !c.encrypted():
		return nil, errors.Wrapf(ErrWrongKey, "backup %s/%s is encrypted and no key was given", m.Namespace, m.ID)
	case m.KeyFingerprint != c.fingerprint:
		return nil, errors.Wrapf(ErrWrongKey, "backup %s/%s is encrypted under key %s, not the given key %s", m.Namespace, m.ID, m.KeyFingerprint, c.fingerprint)
	}
	return c, nil
}
