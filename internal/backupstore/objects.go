package backupstore

import (
	"bytes"
	"context"
	"io"
	"time"

	"github.com/minio/minio-go/v7"
)

// objects is all this package asks of a bucket; keys are whole object
// keys. The store is S3 in production (s3Objects) and a map in the unit
// tests of the chunking and overlay logic.
type objects interface {
	// putIfAbsent stores body under key unless key exists; it says
	// whether it stored it.
	putIfAbsent(ctx context.Context, key string, body []byte) (bool, error)
	// stat returns errNoObject (wrapped) for a key that does not exist.
	stat(ctx context.Context, key string) (objectInfo, error)
	// get returns errNoObject (wrapped) for a key that does not exist.
	get(ctx context.Context, key string) ([]byte, error)
	// list calls fn for each key under prefix, in key order; it stops at
	// fn's first error and returns it.
	list(ctx context.Context, prefix string, fn func(objectInfo) error) error
	// delete succeeds for a key that does not exist.
	delete(ctx context.Context, key string) error
}

type objectInfo struct {
	Key      string
	Size     int64
	Modified time.Time
}

// s3Objects is a bucket of an S3 store, through minio-go.
type s3Objects struct {
	client *minio.Client
	bucket string
}

func (o *s3Objects) putIfAbsent(ctx context.Context, key string, body []byte) (bool, error) {
	_, err := o.stat(ctx, key)
	switch {
	case err == nil:
		return false, nil
	case !isNoObject(err):
		return false, err
	}
	// If-None-Match closes the window between the stat and the put where
	// the store honours it; where it does not, two writers of one chunk
	// store the same content twice, and of a manifest, one wins.
	opts := minio.PutObjectOptions{ContentType: "application/octet-stream"}
	opts.SetMatchETagExcept("*")
	_, err = o.client.PutObject(ctx, o.bucket, key, bytes.NewReader(body), int64(len(body)), opts)
	if minio.ToErrorResponse(err).Code == minio.PreconditionFailed {
		return false, nil
	}
	return err == nil, wrapS3(err, "cannot put "+key)
}

func (o *s3Objects) stat(ctx context.Context, key string) (objectInfo, error) {
	info, err := o.client.StatObject(ctx, o.bucket, key, minio.StatObjectOptions{})
	if err != nil {
		return objectInfo{}, wrapS3(err, "cannot stat "+key)
	}
	return objectInfo{Key: info.Key, Size: info.Size, Modified: info.LastModified}, nil
}

func (o *s3Objects) get(ctx context.Context, key string) ([]byte, error) {
	obj, err := o.client.GetObject(ctx, o.bucket, key, minio.GetObjectOptions{})
	if err != nil {
		return nil, wrapS3(err, "cannot get "+key)
	}
	defer obj.Close() //nolint:errcheck // a read-only body
	body, err := io.ReadAll(obj)
	return body, wrapS3(err, "cannot get "+key)
}

func (o *s3Objects) list(ctx context.Context, prefix string, fn func(objectInfo) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // stops the lister's goroutine when fn stops early
	for info := range o.client.ListObjects(ctx, o.bucket, minio.ListObjectsOptions{Prefix: prefix, Recursive: true}) {
		if info.Err != nil {
			return wrapS3(info.Err, "cannot list "+prefix)
		}
		if err := fn(objectInfo{Key: info.Key, Size: info.Size, Modified: info.LastModified}); err != nil {
			return err
		}
	}
	return nil
}

func (o *s3Objects) delete(ctx context.Context, key string) error {
	return wrapS3(o.client.RemoveObject(ctx, o.bucket, key, minio.RemoveObjectOptions{}), "cannot delete "+key)
}
