package backupstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"strings"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
)

// A backup being written references chunks it found in the store before
// its manifest exists; a collection that ran in between would find them
// unreferenced and delete them. So each puts a lock object first and then
// looks for the other kind: of two that start together at least one sees
// the other (the store reads its own writes), and that one gives up with
// ErrBusy.
const (
	writeLockPrefix = "locks/write-"
	gcLockPrefix    = "locks/gc-"
	// gcLockTTL is how long a collection's lock keeps writers out; a
	// collection renews it every gcLockRenew, so only a collector that
	// died leaves one that writers ignore.
	gcLockTTL   = 30 * time.Minute
	gcLockRenew = 10 * time.Minute
)

type lockBody struct {
	Kind      string    `json:"kind"`
	Namespace string    `json:"namespace,omitempty"`
	Backup    string    `json:"backup,omitempty"`
	Created   time.Time `json:"created"`
}

// lock puts a new lock object under prefix and returns its key.
func (s *Store) lock(ctx context.Context, prefix string, b lockBody) (string, error) {
	var r [12]byte
	if _, err := rand.Read(r[:]); err != nil {
		return "", errors.Wrap(err, "cannot name a lock")
	}
	key := s.prefix + prefix + hex.EncodeToString(r[:])
	b.Created = s.now()
	body, err := json.Marshal(b)
	if err != nil {
		return "", errors.Wrap(err, "cannot encode a lock")
	}
	if _, err := s.objs.putIfAbsent(ctx, key, body); err != nil {
		return "", errors.Wrap(err, "cannot lock the backup store")
	}
	return key, nil
}

// unlock removes a lock; it is used on the way out, with a context of its
// own so that a cancelled caller still leaves no lock behind.
func (s *Store) unlock(key string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// A lock that cannot be removed is ignored once stale.
	_ = s.objs.delete(ctx, key) //nolint:errcheck // see above
}

// liveLocks returns the locks under prefix modified at or after since.
func (s *Store) liveLocks(ctx context.Context, prefix string, since time.Time) ([]objectInfo, []objectInfo, error) {
	var live, stale []objectInfo
	err := s.objs.list(ctx, s.prefix+prefix, func(o objectInfo) error {
		if o.Modified.Before(since) {
			stale = append(stale, o)
		} else {
			live = append(live, o)
		}
		return nil
	})
	return live, stale, err
}

// GCResult is what a CollectGarbage did.
type GCResult struct {
	// Manifests is how many backups, of all namespaces, it kept chunks of.
	Manifests int
	// ChunksKept is how many chunks it left: referenced, or too young.
	ChunksKept int
	// ChunksDeleted and BytesDeleted are what it removed.
	ChunksDeleted int
	BytesDeleted  int64
}

// CollectGarbage deletes the chunks no manifest of any namespace references
// and that were last modified before olderThan. It fails with ErrBusy while
// a backup is being written, one whose writer started after olderThan: a
// writer that started earlier is taken as dead, so olderThan must lie
// before the start of any backup still running. Any manifest it cannot
// read stops it before it deletes anything.
func (s *Store) CollectGarbage(ctx context.Context, olderThan time.Time) (GCResult, error) {
	var res GCResult
	lock, err := s.lock(ctx, gcLockPrefix, lockBody{Kind: "gc"})
	if err != nil {
		return res, err
	}
	defer func() { s.unlock(lock) }()
	locked := s.now()
	// renew keeps the lock younger than gcLockTTL for as long as this runs.
	renew := func() error {
		if s.now().Sub(locked) < gcLockRenew {
			return nil
		}
		renewed, err := s.lock(ctx, gcLockPrefix, lockBody{Kind: "gc"})
		if err != nil {
			return err
		}
		s.unlock(lock)
		lock, locked = renewed, s.now()
		return nil
	}

	writers, stale, err := s.liveLocks(ctx, writeLockPrefix, olderThan)
	if err != nil {
		return res, err
	}
	if len(writers) > 0 {
		return res, errors.Wrapf(ErrBusy, "%d backups are being written (lock %s)", len(writers), writers[0].Key)
	}
	for _, o := range stale {
		if err := s.objs.delete(ctx, o.Key); err != nil {
			return res, err
		}
	}

	referenced := map[string]bool{}
	err = s.objs.list(ctx, s.prefix+"namespaces/", func(o objectInfo) error {
		rest := strings.TrimPrefix(o.Key, s.prefix+"namespaces/")
		if parts := strings.Split(rest, "/"); len(parts) != 4 || parts[1] != "backups" || parts[3] != "manifest.json" {
			return nil
		}
		if err := renew(); err != nil {
			return err
		}
		m, err := s.manifest(ctx, o.Key)
		if errors.Is(err, ErrNotFound) {
			return nil // deleted since it was listed
		}
		if err != nil {
			return errors.Wrap(err, "cannot read every manifest, so cannot tell garbage")
		}
		res.Manifests++
		for _, id := range m.Chunks() {
			referenced[id] = true
		}
		return nil
	})
	if err != nil {
		return res, err
	}

	err = s.objs.list(ctx, s.prefix+"chunks/", func(o objectInfo) error {
		id := o.Key[strings.LastIndexByte(o.Key, '/')+1:]
		if referenced[id] || !o.Modified.Before(olderThan) {
			res.ChunksKept++
			return nil
		}
		if err := renew(); err != nil {
			return err
		}
		if err := s.objs.delete(ctx, o.Key); err != nil {
			return err
		}
		res.ChunksDeleted++
		res.BytesDeleted += o.Size
		return nil
	})
	return res, err
}
