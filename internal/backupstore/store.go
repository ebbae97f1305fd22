// Package backupstore keeps VM backups in an S3 bucket as content-addressed
// chunks.
//
// A disk is cut at fixed ChunkSize windows of its offsets; each window's
// data is a chunk named by its content (sha256, or an HMAC under the
// Location's key, which then also seals the chunk with AES-256-GCM), so
// identical data — two VMs from one image, a block that did not change —
// is stored once per Location. A backup is a manifest listing, for each
// disk, the ranges that hold data and the chunk each comes from; the
// first backup of a disk reads it whole, later ones only what changed, but
// every manifest lists all its disk's data, so deleting any backup never
// breaks another. Chunks no manifest references are removed by
// CollectGarbage, which a backup being written and a collection exclude
// each other from (locks under "locks/").
//
// Layout under the Location's Prefix:
//
//	chunks/<first 4 hex digits of id>/<id>
//	namespaces/<namespace>/backups/<backup id>/manifest.json
//	locks/write-<random>, locks/gc-<random>
package backupstore

import (
	"context"
	"encoding/json"
	"sort"
	"strings"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// Location is a place for backups: a bucket of an S3-compatible store and
// a prefix in it.
type Location struct {
	// Endpoint is host[:port], without scheme; Secure selects HTTPS.
	Endpoint  string
	Secure    bool
	Region    string
	Bucket    string
	Prefix    string
	AccessKey string
	SecretKey string
	// Key, when set (KeySize bytes), names and seals chunks and seals
	// specs before they leave the node. Backups written under one key
	// read only with it.
	Key []byte
}

// Store is the backups of one Location. It is safe for concurrent use.
type Store struct {
	objs   objects
	prefix string
	codec  *codec
	now    func() time.Time
}

// Open connects to loc's bucket: ErrNoBucket when it does not exist,
// ErrAccessDenied when the store refuses the credentials.
func Open(ctx context.Context, loc Location) (*Store, error) {
	client, err := minio.New(loc.Endpoint, &minio.Options{
		Creds:  credentials.NewStaticV4(loc.AccessKey, loc.SecretKey, ""),
		Secure: loc.Secure,
		Region: loc.Region,
	})
	if err != nil {
		return nil, errors.Wrapf(err, "cannot make a client of backup store %s", loc.Endpoint)
	}
	ok, err := client.BucketExists(ctx, loc.Bucket)
	if err != nil {
		return nil, wrapS3(err, "cannot look up backup bucket "+loc.Bucket)
	}
	if !ok {
		return nil, errors.Wrapf(ErrNoBucket, "cannot open bucket %s at %s", loc.Bucket, loc.Endpoint)
	}
	return newStore(&s3Objects{client: client, bucket: loc.Bucket}, loc.Prefix, loc.Key)
}

func newStore(objs objects, prefix string, key []byte) (*Store, error) {
	c, err := newCodec(key)
	if err != nil {
		return nil, err
	}
	if prefix = strings.Trim(prefix, "/"); prefix != "" {
		prefix += "/"
	}
	return &Store{objs: objs, prefix: prefix, codec: c, now: time.Now}, nil
}

// Keys, all under the prefix.

func (s *Store) chunkKey(id string) string {
	return s.prefix + "chunks/" + id[:4] + "/" + id
}

func (s *Store) backupsKey(namespace string) string {
	return s.prefix + "namespaces/" + namespace + "/backups/"
}

func (s *Store) manifestKey(namespace, id string) string {
	return s.backupsKey(namespace) + id + "/manifest.json"
}

func isNoObject(err error) bool { return errors.Is(err, errNoObject) }

// Manifest returns backup id of namespace, ErrNotFound if there is none.
func (s *Store) Manifest(ctx context.Context, namespace, id string) (Manifest, error) {
	if err := checkName("namespace", namespace); err != nil {
		return Manifest{}, err
	}
	if err := checkName("backup ID", id); err != nil {
		return Manifest{}, err
	}
	return s.manifest(ctx, s.manifestKey(namespace, id))
}

func (s *Store) manifest(ctx context.Context, key string) (Manifest, error) {
	body, err := s.objs.get(ctx, key)
	if isNoObject(err) {
		return Manifest{}, errors.Wrapf(ErrNotFound, "no manifest %s", key)
	}
	if err != nil {
		return Manifest{}, err
	}
	m, err := decodeManifest(body)
	if err != nil {
		return Manifest{}, errors.Wrapf(err, "manifest %s", key)
	}
	if want := s.manifestKey(m.Namespace, m.ID); key != want {
		return Manifest{}, errors.Errorf("manifest %s names backup %s/%s, which belongs at %s", key, m.Namespace, m.ID, want)
	}
	if m.SealedSpec != nil {
		if c, err := s.codec.forManifest(m); err == nil {
			if m.Spec, err = c.unseal(specAD(m), m.SealedSpec); err != nil {
				return Manifest{}, errors.Wrapf(err, "manifest %s: spec", key)
			}
		}
	}
	return m, nil
}

// Backups returns the backups of one namespace, oldest first.
func (s *Store) Backups(ctx context.Context, namespace string) ([]Manifest, error) {
	if err := checkName("namespace", namespace); err != nil {
		return nil, err
	}
	var ms []Manifest
	err := s.objs.list(ctx, s.backupsKey(namespace), func(o objectInfo) error {
		if !strings.HasSuffix(o.Key, "/manifest.json") {
			return nil
		}
		m, err := s.manifest(ctx, o.Key)
		if errors.Is(err, ErrNotFound) {
			return nil // deleted since it was listed
		}
		ms = append(ms, m)
		return err
	})
	if err != nil {
		return nil, err
	}
	sort.SliceStable(ms, func(i, j int) bool { return ms[i].Created.Before(ms[j].Created) })
	return ms, nil
}

// Delete removes backup id of namespace: its manifest. Its chunks stay
// until CollectGarbage finds no other manifest references them.
func (s *Store) Delete(ctx context.Context, namespace, id string) error {
	if err := checkName("namespace", namespace); err != nil {
		return err
	}
	if err := checkName("backup ID", id); err != nil {
		return err
	}
	key := s.manifestKey(namespace, id)
	if _, err := s.objs.stat(ctx, key); err != nil {
		if isNoObject(err) {
			return errors.Wrapf(ErrNotFound, "no manifest %s", key)
		}
		return err
	}
	return s.objs.delete(ctx, key)
}

// encodeManifest is the stored form of m: its spec sealed when c encrypts.
func (s *Store) encodeManifest(c *codec, m Manifest) ([]byte, error) {
	if c.encrypted() && m.Spec != nil {
		m.SealedSpec = c.seal(specAD(m), m.Spec)
		m.Spec = nil
	}
	body, err := json.Marshal(m)
	return body, errors.Wrap(err, "cannot encode manifest")
}

// specAD binds a sealed spec to its backup, so that it opens in no other.
func specAD(m Manifest) string { return "spec " + m.Namespace + "/" + m.ID }
