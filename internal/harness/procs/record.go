package procs

import (
	"encoding/json"
	"os"
	"path/filepath"
	"syscall"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
)

// Record names what a test process started and has to clean up: a JSON
// file in a run directory, locked (flock) by that process for as long as
// it keeps the Record. The kernel drops the lock with the process however
// it ends, so a record that nobody locks is a killed run's, which the next
// run removes (RemoveAbandoned).
type Record struct {
	path string
	lock *os.File
}

// WriteRecord writes v as the record name in dir (dir/name.json), locked
// until Remove. The file is locked before it is renamed into place, so that
// no run takes a record being written for a killed run's.
func WriteRecord(dir, name string, v any) (*Record, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, errors.Wrap(err, "cannot create the records' directory")
	}
	f, err := os.CreateTemp(dir, ".record-")
	if err != nil {
		return nil, errors.Wrap(err, "cannot create a record")
	}
	r := &Record{path: filepath.Join(dir, name+".json"), lock: f}
	b, err := json.Marshal(v)
	if err == nil {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	}
	if err == nil {
		_, err = f.Write(b)
	}
	if err == nil {
		err = os.Rename(f.Name(), r.path)
	}
	if err != nil {
		_ = os.Remove(f.Name())
		_ = f.Close()
		return nil, errors.Wrapf(err, "cannot write record %s", r.path)
	}
	return r, nil
}

// Path is the record's file.
func (r *Record) Path() string { return r.path }

// Remove removes the record, once what it names is gone, and unlocks it.
func (r *Record) Remove() {
	_ = os.Remove(r.path)
	_ = r.lock.Close()
}

// Abandon unlocks the record and leaves it, as the death of its process
// would: for a test of what the next run does.
func (r *Record) Abandon() { _ = r.lock.Close() }

// RemoveAbandoned calls remove with each record in dir that no process
// locks, a killed run's, and deletes the record once remove succeeded. It
// holds the record's lock meanwhile, so that two runs never remove the same
// one; a record whose removal failed stays for the next run to retry.
func RemoveAbandoned[T any](dir string, remove func(T) error) error {
	paths, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return errors.Wrap(err, "cannot list the records")
	}
	var errs []error
	for _, p := range paths {
		errs = append(errs, removeAbandoned(p, remove))
	}
	return errors.Join(errs...)
}

func removeAbandoned[T any](path string, remove func(T) error) error {
	f, err := os.Open(path) //nolint:gosec // a record in the caller's run directory
	if err != nil {
		return nil //nolint:nilerr // removed meanwhile: its process stopped what it names
	}
	defer func() { _ = f.Close() }()
	if syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil {
		return nil // its process lives, or another run removes it
	}
	// Locked only once its process removed it (Remove unlinks first), or
	// another run did.
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil || st.Nlink == 0 {
		return nil //nolint:nilerr // gone meanwhile
	}
	var v T
	if err := json.NewDecoder(f).Decode(&v); err != nil {
		return errors.Wrapf(err, "cannot read record %s", path)
	}
	if err := remove(v); err != nil {
		return errors.Wrapf(err, "cannot remove what record %s names", path)
	}
	return errors.Wrapf(os.Remove(path), "cannot remove record %s", path)
}
