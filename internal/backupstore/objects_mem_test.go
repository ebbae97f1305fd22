package backupstore

import (
	"context"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// clock is the time of a memObjects and of the Store on it.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// memObjects is a bucket in memory; it counts the gets of each key.
type memObjects struct {
	clock *clock
	mu    sync.Mutex
	objs  map[string]memObject
	gets  map[string]int
}

type memObject struct {
	body     []byte
	modified time.Time
}

func (o *memObjects) putIfAbsent(ctx context.Context, key string, body []byte) (bool, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if _, ok := o.objs[key]; ok {
		return false, ctx.Err()
	}
	o.objs[key] = memObject{append([]byte(nil), body...), o.clock.Now()}
	return true, ctx.Err()
}

func (o *memObjects) stat(ctx context.Context, key string) (objectInfo, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	obj, ok := o.objs[key]
	if !ok {
		return objectInfo{}, errNoObject
	}
	return objectInfo{Key: key, Size: int64(len(obj.body)), Modified: obj.modified}, ctx.Err()
}

func (o *memObjects) get(ctx context.Context, key string) ([]byte, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	obj, ok := o.objs[key]
	if !ok {
		return nil, errNoObject
	}
	o.gets[key]++
	return append([]byte(nil), obj.body...), ctx.Err()
}

func (o *memObjects) list(ctx context.Context, prefix string, fn func(objectInfo) error) error {
	o.mu.Lock()
	var infos []objectInfo
	for k, obj := range o.objs {
		if strings.HasPrefix(k, prefix) {
			infos = append(infos, objectInfo{Key: k, Size: int64(len(obj.body)), Modified: obj.modified})
		}
	}
	o.mu.Unlock()
	sort.Slice(infos, func(i, j int) bool { return infos[i].Key < infos[j].Key })
	for _, info := range infos {
		if err := fn(info); err != nil {
			return err
		}
	}
	return ctx.Err()
}

func (o *memObjects) delete(ctx context.Context, key string) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.objs, key)
	return ctx.Err()
}

// keys returns the keys under prefix.
func (o *memObjects) keys(prefix string) []string {
	var keys []string
	_ = o.list(context.Background(), prefix, func(i objectInfo) error {
		keys = append(keys, i.Key)
		return nil
	})
	return keys
}

func (o *memObjects) set(key string, body []byte) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.objs[key] = memObject{body, o.clock.Now()}
}

func (o *memObjects) body(key string) []byte {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.objs[key].body
}

// memStore is a Store on memObjects of its own, under prefix "backups".
type memStore struct {
	*Store
	objs  *memObjects
	clock *clock
}

func newMemStore(t testing.TB, key []byte) memStore {
	t.Helper()
	c := &clock{now: time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)}
	objs := &memObjects{clock: c, objs: map[string]memObject{}, gets: map[string]int{}}
	s, err := newStore(objs, "/backups/", key)
	require.NoError(t, err)
	s.now = c.Now
	return memStore{s, objs, c}
}

// withKey is another Store on the same objects, under key.
func (m memStore) withKey(t testing.TB, key []byte) *Store {
	t.Helper()
	s, err := newStore(m.objs, "backups", key)
	require.NoError(t, err)
	s.now = m.clock.Now
	return s
}
