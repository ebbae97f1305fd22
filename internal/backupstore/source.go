package backupstore

import (
	"context"
	"sync"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/agent/driver"
)

var _ driver.DiskSource = (*Source)(nil)

const (
	// fetchAhead is how many chunks a Source fetches ahead of the one it
	// hands, at once.
	fetchAhead = 8
	// sourceCache bounds the chunks a Source keeps for a later extent.
	sourceCache = 64 * ChunkSize
)

// Source is one disk of a backup to restore; it implements
// driver.DiskSource.
type Source struct {
	s     *Store
	codec *codec
	m     Manifest
	disk  Disk
}

// Source returns disk of backup m, ErrNotFound where m has no such disk,
// ErrWrongKey where m was written under another key.
func (s *Store) Source(m Manifest, disk string) (*Source, error) {
	c, err := s.codec.forManifest(m)
	if err != nil {
		return nil, err
	}
	if err := m.validate(); err != nil {
		return nil, errors.Wrapf(err, "backup %s/%s", m.Namespace, m.ID)
	}
	d, ok := m.Disk(disk)
	if !ok {
		return nil, errors.Wrapf(ErrNotFound, "backup %s/%s has no disk %s", m.Namespace, m.ID, disk)
	}
	return &Source{s: s, codec: c, m: m, disk: d}, nil
}

// Disk names the disk and gives its size.
func (src *Source) Disk() driver.BackupDisk {
	return driver.BackupDisk{Name: src.disk.Name, Size: src.disk.Size}
}

// Extents calls fn for each extent of the disk, in increasing offset
// order. Each chunk is fetched once where the extents that use it lie
// within sourceCache of each other, and checked against its name before
// any of it is handed: a chunk that does not match is a
// *CorruptChunkError.
func (src *Source) Extents(ctx context.Context, fn func(off int64, p []byte) error) error {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel() // stops the fetches first, so that they can end
		wg.Wait()
	}()
	exts := src.disk.Extents
	plan := planFetches(exts)

	results := make([]chan fetched, len(plan.chunks))
	for i := range results {
		results[i] = make(chan fetched, 1)
	}
	slots := make(chan struct{}, fetchAhead)
	wg.Go(func() {
		for t, id := range plan.chunks {
			select {
			case slots <- struct{}{}:
			case <-ctx.Done():
				return
			}
			wg.Go(func() {
				p, err := src.s.chunk(ctx, src.codec, id)
				results[t] <- fetched{p, err}
			})
		}
	})

	kept := map[int][]byte{}
	for i, e := range exts {
		t := plan.fetch[i]
		p, ok := kept[t]
		if !ok {
			var r fetched
			select {
			case r = <-results[t]:
				<-slots
			case <-ctx.Done():
				return ctx.Err()
			}
			if r.err != nil {
				return r.err
			}
			p = r.p
		}
		if plan.lastUse[t] > i {
			kept[t] = p
		} else {
			delete(kept, t)
		}
		if e.ChunkOffset+e.Length > int64(len(p)) {
			return &CorruptChunkError{Chunk: e.Chunk, Reason: "shorter than the extents that use it"}
		}
		if err := fn(e.Offset, p[e.ChunkOffset:e.ChunkOffset+e.Length]); err != nil {
			return err
		}
	}
	return nil
}

type fetched struct {
	p   []byte
	err error
}

// fetchPlan says which fetch serves each extent: fetch[i] indexes chunks,
// the chunks to fetch in order; lastUse[t] is the last extent fetch t
// serves, until which its chunk is kept.
type fetchPlan struct {
	chunks  []string
	fetch   []int
	lastUse []int
}

// planFetches fetches a chunk once for all the extents that use it, unless
// keeping it until its last use would hold more than sourceCache; such a
// chunk is fetched again where it is used next.
func planFetches(exts []Extent) fetchPlan {
	last := map[string]int{}
	for i, e := range exts {
		last[e.Chunk] = i
	}
	var plan fetchPlan
	plan.fetch = make([]int, len(exts))
	live := map[string]int{} // chunk → its fetch, kept
	for i, e := range exts {
		t, ok := live[e.Chunk]
		if !ok {
			t = len(plan.chunks)
			plan.chunks = append(plan.chunks, e.Chunk)
			plan.lastUse = append(plan.lastUse, i)
			if last[e.Chunk] > i && (len(live)+1)*ChunkSize <= sourceCache {
				live[e.Chunk] = t
			}
		}
		plan.fetch[i] = t
		plan.lastUse[t] = i
		if last[e.Chunk] == i {
			delete(live, e.Chunk)
		}
	}
	return plan
}

// chunk fetches chunk id and returns its content, checked.
func (s *Store) chunk(ctx context.Context, c *codec, id string) ([]byte, error) {
	body, err := s.objs.get(ctx, s.chunkKey(id))
	if isNoObject(err) {
		return nil, &CorruptChunkError{Chunk: id, Reason: "missing from the store"}
	}
	if err != nil {
		return nil, err
	}
	return c.open(id, body)
}
