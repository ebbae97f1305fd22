package backupstore

import (
	"fmt"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/minio/minio-go/v7"
)

// Errors a caller must tell apart; test with errors.Is.
var (
	// ErrAccessDenied: the store refused the credentials, or they do not
	// reach what was asked.
	ErrAccessDenied = errors.New("access denied by the backup store")
	// ErrNoBucket: the Location's bucket does not exist.
	ErrNoBucket = errors.New("backup bucket does not exist")
	// ErrNotFound: no manifest for the backup asked for.
	ErrNotFound = errors.New("backup not found")
	// ErrExists: a backup with that ID is in the store already.
	ErrExists = errors.New("backup exists already")
	// ErrCorrupt: a chunk is missing or does not match its name; the
	// error is a *CorruptChunkError naming it.
	ErrCorrupt = errors.New("corrupt chunk")
	// ErrWrongKey: the backup is encrypted under another key than the
	// Location's, or under one the Location does not have.
	ErrWrongKey = errors.New("wrong backup key")
	// ErrBusy: a garbage collection and a backup being written exclude
	// each other; try again later.
	ErrBusy = errors.New("backup store busy")
)

// CorruptChunkError names a chunk that is missing or does not match its
// name; errors.Is(err, ErrCorrupt) holds for it.
type CorruptChunkError struct {
	Chunk  string
	Reason string
}

func (e *CorruptChunkError) Error() string {
	return fmt.Sprintf("corrupt chunk %s: %s", e.Chunk, e.Reason)
}

// Is makes errors.Is(err, ErrCorrupt) hold.
func (e *CorruptChunkError) Is(target error) bool { return target == ErrCorrupt }

// errNoObject is what an objects implementation returns for a key it
// does not hold.
var errNoObject = errors.New("no such object")

// storeError is a failed store call: what was done, the kind a caller
// tests for (may be nil) and the client's own error.
type storeError struct {
	op   string
	kind error
	err  error
}

func (e *storeError) Error() string {
	if e.kind == nil {
		return e.op + ": " + e.err.Error()
	}
	return e.op + ": " + e.kind.Error() + ": " + e.err.Error()
}

func (e *storeError) Unwrap() []error {
	if e.kind == nil {
		return []error{e.err}
	}
	return []error{e.kind, e.err}
}

// wrapS3 wraps a minio-go error with what was being done, and with the
// kind of failure a caller must tell apart where the store said which.
func wrapS3(err error, op string) error {
	if err == nil {
		return nil
	}
	var kind error
	switch minio.ToErrorResponse(err).Code {
	case minio.AccessDenied, "InvalidAccessKeyId", "SignatureDoesNotMatch":
		kind = ErrAccessDenied
	case minio.NoSuchBucket:
		kind = ErrNoBucket
	case minio.NoSuchKey:
		kind = errNoObject
	}
	return &storeError{op: op, kind: kind, err: err}
}
