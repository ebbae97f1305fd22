package backupstore

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"regexp"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
)

// ManifestVersion is the version of the manifests this package writes; it
// reads no newer one, so an old agent never misreads a newer layout.
const ManifestVersion = 1

// Manifest is one backup: which VM it is of and, for each disk, where its
// data lies in the store. A backup exists once its manifest does, and it
// references every chunk it needs itself, so it never depends on another.
type Manifest struct {
	Version   int    `json:"version"`
	ID        string `json:"id"`
	Namespace string `json:"namespace"`
	VMName    string `json:"vmName"`
	VMUID     string `json:"vmUID"`
	// Parent is the backup this one was taken incrementally to. It is
	// informational only: Disks holds all of this backup's data.
	Parent  string    `json:"parent,omitempty"`
	Created time.Time `json:"created"`
	// Full: the disks were read whole, not only what changed since Parent.
	Full bool `json:"full"`
	// Encrypted: chunks are named and sealed under a key, the one
	// KeyFingerprint identifies (without revealing it).
	Encrypted      bool   `json:"encrypted"`
	KeyFingerprint string `json:"keyFingerprint,omitempty"`
	// Spec is the caller's, opaque here (the VM's spec). In an encrypted
	// backup it is stored sealed (SealedSpec) and Spec is nil when the
	// manifest is read without the backup's key.
	Spec       json.RawMessage `json:"spec,omitempty"`
	SealedSpec []byte          `json:"sealedSpec,omitempty"`
	Disks      []Disk          `json:"disks"`
}

// Disk is one disk of a backup: the ranges of it that hold data, in
// increasing offset order; everything else reads as zeros.
type Disk struct {
	Name    string   `json:"name"`
	Size    int64    `json:"size"`
	Extents []Extent `json:"extents"`
}

// Extent is a range of a disk that holds Length bytes of chunk Chunk,
// starting ChunkOffset bytes into the chunk.
type Extent struct {
	Offset      int64  `json:"offset"`
	Length      int64  `json:"length"`
	Chunk       string `json:"chunk"`
	ChunkOffset int64  `json:"chunkOffset"`
}

func (e Extent) end() int64 { return e.Offset + e.Length }

// Disk returns the disk of the manifest named name.
func (m Manifest) Disk(name string) (Disk, bool) {
	for _, d := range m.Disks {
		if d.Name == name {
			return d, true
		}
	}
	return Disk{}, false
}

// Chunks returns the distinct chunks the manifest references.
func (m Manifest) Chunks() []string {
	seen := map[string]bool{}
	var ids []string
	for _, d := range m.Disks {
		for _, e := range d.Extents {
			if !seen[e.Chunk] {
				seen[e.Chunk] = true
				ids = append(ids, e.Chunk)
			}
		}
	}
	return ids
}

// A name is one path segment of an object key, so that a namespace or a
// backup ID can never reach into another's keys.
var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$`)

func checkName(what, name string) error {
	if !nameRE.MatchString(name) {
		return errors.Errorf("invalid %s %q: want letters, digits, '.', '_' or '-', starting with a letter or digit", what, name)
	}
	return nil
}

func isChunkID(id string) bool {
	if len(id) != 64 {
		return false
	}
	_, err := hex.DecodeString(id)
	return err == nil
}

// validate checks what the rest of the package relies on: a manifest that
// fails it is not used, least of all by the garbage collector.
func (m Manifest) validate() error {
	if m.Version < 1 || m.Version > ManifestVersion {
		return errors.Errorf("manifest version %d, this agent reads up to %d", m.Version, ManifestVersion)
	}
	if err := checkName("namespace", m.Namespace); err != nil {
		return err
	}
	if err := checkName("backup ID", m.ID); err != nil {
		return err
	}
	names := map[string]bool{}
	for _, d := range m.Disks {
		if d.Name == "" || names[d.Name] {
			return errors.Errorf("disk name %q empty or repeated", d.Name)
		}
		names[d.Name] = true
		var end int64
		for i, e := range d.Extents {
			switch {
			case !isChunkID(e.Chunk):
				return errors.Errorf("disk %s extent %d: chunk id %q is not 64 hex digits", d.Name, i, e.Chunk)
			case e.Length <= 0 || e.ChunkOffset < 0 || e.ChunkOffset+e.Length > ChunkSize:
				return errors.Errorf("disk %s extent %d: length %d at chunk offset %d is not within a chunk", d.Name, i, e.Length, e.ChunkOffset)
			case e.Offset < end || e.end() > d.Size:
				return errors.Errorf("disk %s extent %d: [%d, %d) overlaps the one before or ends past the disk's %d bytes", d.Name, i, e.Offset, e.end(), d.Size)
			}
			end = e.end()
		}
	}
	return nil
}

func decodeManifest(body []byte) (Manifest, error) {
	var m Manifest
	if err := json.Unmarshal(body, &m); err != nil {
		return Manifest{}, errors.Wrap(err, "cannot decode manifest")
	}
	if err := m.validate(); err != nil {
		return Manifest{}, fmt.Errorf("invalid manifest: %w", err)
	}
	return m, nil
}
