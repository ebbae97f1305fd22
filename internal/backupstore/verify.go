package backupstore

import (
	"context"
	"slices"
	"strings"
	"sync"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
)

// verifyWorkers is how many chunks Verify reads at once.
const verifyWorkers = 8

// VerifyResult is what a Verify read.
type VerifyResult struct {
	// Chunks is how many distinct chunks were checked, missing ones
	// included; Bytes is what was read of them as stored.
	Chunks int
	Bytes  int64
	// Bad names each chunk that is missing or does not match, with why,
	// in chunk ID order.
	Bad []BadChunk
}

// BadChunk is a chunk that is missing from the store or does not match
// its name.
type BadChunk struct {
	Chunk  string
	Reason string
}

// BadRange is a range of a backup's disk that a bad chunk holds.
type BadRange struct {
	Disk   string
	Extent Extent
	Reason string
}

// BadRanges are the ranges of m's disks that res's bad chunks hold, disk
// by disk as m lists them, each in offset order.
func (res VerifyResult) BadRanges(m Manifest) []BadRange {
	why := make(map[string]string, len(res.Bad))
	for _, b := range res.Bad {
		why[b.Chunk] = b.Reason
	}
	var out []BadRange
	for _, d := range m.Disks {
		for _, e := range d.Extents {
			if r, bad := why[e.Chunk]; bad {
				out = append(out, BadRange{Disk: d.Name, Extent: e, Reason: r})
			}
		}
	}
	return out
}

// VerifyProgress is called as Verify goes, after each chunk, with the
// chunks and bytes checked so far; never by two goroutines at once.
type VerifyProgress func(chunks int, bytes int64)

// Verify reads every chunk backup m references and checks it against its
// name (and, encrypted, its seal), calling progress, if not nil, after
// each. A bad chunk is reported in Bad; the error is for what kept Verify
// from reading, ErrWrongKey among them.
func (s *Store) Verify(ctx context.Context, m Manifest, progress VerifyProgress) (VerifyResult, error) {
	var res VerifyResult
	c, err := s.codec.forManifest(m)
	if err != nil {
		return res, err
	}
	if err := m.validate(); err != nil {
		return res, errors.Wrapf(err, "backup %s/%s", m.Namespace, m.ID)
	}
	// The longest any extent needs each chunk to be.
	need := map[string]int64{}
	for _, d := range m.Disks {
		for _, e := range d.Extents {
			need[e.Chunk] = max(need[e.Chunk], e.ChunkOffset+e.Length)
		}
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ids := make(chan string)
	var (
		mu    sync.Mutex
		first error
		wg    sync.WaitGroup
	)
	for range verifyWorkers {
		wg.Go(func() {
			for id := range ids {
				n, bad, err := s.verifyChunk(ctx, c, id, need[id])
				mu.Lock()
				switch {
				case err != nil && first == nil:
					first = err
					cancel()
				case err == nil:
					res.Chunks++
					res.Bytes += n
					if bad != "" {
						res.Bad = append(res.Bad, BadChunk{Chunk: id, Reason: bad})
					}
					if progress != nil {
						progress(res.Chunks, res.Bytes)
					}
				}
				mu.Unlock()
			}
		})
	}
	for _, id := range m.Chunks() {
		select {
		case ids <- id:
		case <-ctx.Done():
		}
	}
	close(ids)
	wg.Wait()
	if first != nil {
		return res, errors.Wrapf(first, "cannot verify backup %s/%s", m.Namespace, m.ID)
	}
	if err := ctx.Err(); err != nil {
		return res, err
	}
	slices.SortFunc(res.Bad, func(a, b BadChunk) int { return strings.Compare(a.Chunk, b.Chunk) })
	return res, nil
}

// verifyChunk reads chunk id: its stored size, and why it is bad, if it is.
func (s *Store) verifyChunk(ctx context.Context, c *codec, id string, need int64) (int64, string, error) {
	body, err := s.objs.get(ctx, s.chunkKey(id))
	switch {
	case isNoObject(err):
		return 0, "missing from the store", nil
	case err != nil:
		return 0, "", err
	}
	p, err := c.open(id, body)
	var corrupt *CorruptChunkError
	switch {
	case errors.As(err, &corrupt):
		return int64(len(body)), corrupt.Reason, nil
	case err != nil:
		return 0, "", err
	case int64(len(p)) < need:
		return int64(len(body)), "shorter than the extents that use it", nil
	}
	return int64(len(body)), "", nil
}
