package backuplocation

import "sync"

// Collections lets the hub's garbage collection of a location and the
// start of a backup to it exclude each other. The store's own locks
// (internal/backupstore) keep the data safe either way, but a backup that
// starts while a collection runs fails with ErrBusy; within one hub it
// waits instead. A nil *Collections excludes nothing.
type Collections struct {
	mu    sync.Mutex
	locks map[string]*sync.RWMutex
}

// NewCollections returns Collections where nothing runs.
func NewCollections() *Collections {
	return &Collections{locks: map[string]*sync.RWMutex{}}
}

func (c *Collections) of(location string) *sync.RWMutex {
	c.mu.Lock()
	defer c.mu.Unlock()
	l, ok := c.locks[location]
	if !ok {
		l = &sync.RWMutex{}
		c.locks[location] = l
	}
	return l
}

// Starting holds off collections of location while a backup to it is
// started, until done is called; ok is false, and there is nothing to
// call, while a collection runs.
func (c *Collections) Starting(location string) (done func(), ok bool) {
	if c == nil {
		return func() {}, true
	}
	l := c.of(location)
	if !l.TryRLock() {
		return nil, false
	}
	return l.RUnlock, true
}

// Collecting holds off the start of backups to location until done is
// called; ok is false, and there is nothing to call, while one starts or
// another collection runs.
func (c *Collections) Collecting(location string) (done func(), ok bool) {
	if c == nil {
		return func() {}, true
	}
	l := c.of(location)
	if !l.TryLock() {
		return nil, false
	}
	return l.Unlock, true
}
