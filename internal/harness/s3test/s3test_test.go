package s3test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/virtfleet/virtfleet/internal/harness/freeport"
	"github.com/virtfleet/virtfleet/internal/harness/procs"
)

// envLeftover makes the test binary a run that starts a server in the
// directory it names, prints the server's record's path and waits to be
// killed: a test killed before it stopped its server.
const envLeftover = "S3TEST_LEFTOVER_DIR"

func TestMain(m *testing.M) {
	if dir := os.Getenv(envLeftover); dir != "" {
		s, err := Start(context.Background(), dir, os.Stderr)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Println(s.proc.record.Path())
		select {}
	}
	os.Exit(m.Run())
}

func TestServer(t *testing.T) {
	s := New(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	t.Run("AnswersOnLoopbackOnly", func(t *testing.T) {
		assert.True(t, strings.HasPrefix(s.Endpoint, "127.0.0.1:"), s.Endpoint)
	})

	c, err := s.Client()
	require.NoError(t, err)
	require.NoError(t, s.MakeBucket(ctx, "backups"))

	t.Run("MakesABucket", func(t *testing.T) {
		buckets, err := c.ListBuckets(ctx)
		require.NoError(t, err)
		var names []string
		for _, b := range buckets {
			names = append(names, b.Name)
		}
		assert.Equal(t, []string{"backups"}, names, "and no other: Start's probe leaves none")
	})

	t.Run("RefusesAnUploadIntoAMissingBucket", func(t *testing.T) {
		_, err := c.PutObject(ctx, "missing", "x", strings.NewReader("x"), 1, minio.PutObjectOptions{})
		assert.Equal(t, "NoSuchBucket", minio.ToErrorResponse(err).Code, "%v", err)
	})

	t.Run("PutsStatsGetsAndDeletesAnObject", func(t *testing.T) {
		data := bytes.Repeat([]byte("chunk"), 100_000)
		_, err := c.PutObject(ctx, "backups", "chunks/ab/cd", bytes.NewReader(data), int64(len(data)), minio.PutObjectOptions{})
		require.NoError(t, err)

		info, err := c.StatObject(ctx, "backups", "chunks/ab/cd", minio.StatObjectOptions{})
		require.NoError(t, err)
		assert.Equal(t, int64(len(data)), info.Size)

		o, err := c.GetObject(ctx, "backups", "chunks/ab/cd", minio.GetObjectOptions{})
		require.NoError(t, err)
		got, err := io.ReadAll(o)
		require.NoError(t, err)
		assert.Equal(t, data, got)

		require.NoError(t, c.RemoveObject(ctx, "backups", "chunks/ab/cd", minio.RemoveObjectOptions{}))
		_, err = c.StatObject(ctx, "backups", "chunks/ab/cd", minio.StatObjectOptions{})
		assert.Equal(t, "NoSuchKey", minio.ToErrorResponse(err).Code, "%v", err)
	})

	t.Run("RefusesWrongCredentials", func(t *testing.T) {
		for _, tc := range []struct {
			name, accessKey, secretKey, code string
		}{
			{name: "a wrong secret key", accessKey: s.AccessKey, secretKey: s.SecretKey + "x", code: "SignatureDoesNotMatch"},
			{name: "an unknown access key", accessKey: "NOBODY" + s.AccessKey, secretKey: s.SecretKey, code: "InvalidAccessKeyId"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				bad, err := s.ClientWith(tc.accessKey, tc.secretKey)
				require.NoError(t, err)
				_, err = bad.ListBuckets(ctx)
				assert.Equal(t, tc.code, minio.ToErrorResponse(err).Code, "%v", err)
				err = bad.MakeBucket(ctx, "intruder", minio.MakeBucketOptions{Region: s.Region})
				assert.Equal(t, tc.code, minio.ToErrorResponse(err).Code, "%v", err)
			})
		}
	})
}

// TestStartKillsALeftover kills a run while its server runs, as `go test`
// does to a test binary past its timeout, and starts another server.
func TestStartKillsALeftover(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two servers; skipped with -short")
	}
	ensure(t) // the run would build weed, or fail where New skips

	self, err := os.Executable()
	require.NoError(t, err)
	run := exec.Command(self, "-test.run=^$") //nolint:gosec // this test binary
	run.Env = append(os.Environ(), envLeftover+"="+t.TempDir())
	run.Stderr = testWriter{t}
	stdout, err := run.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, run.Start())
	t.Cleanup(func() { _ = run.Process.Kill(); _ = run.Wait() })
	path, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err, "the run never started its server")
	path = strings.TrimSpace(path)
	b, err := os.ReadFile(path) //nolint:gosec // the record the run printed
	require.NoError(t, err)
	var rec record
	require.NoError(t, json.Unmarshal(b, &rec))
	require.True(t, procs.Alive(rec.PID, rec.Start))

	require.NoError(t, run.Process.Kill())
	_ = run.Wait()
	require.True(t, procs.Alive(rec.PID, rec.Start), "weed outlives the run that started it")

	s := New(t)
	assert.False(t, procs.Alive(rec.PID, rec.Start), "Start kills the leftover")
	assert.NoFileExists(t, path, "and removes its record")
	for _, sock := range rec.Sockets {
		assert.NoFileExists(t, sock, "and its sockets")
	}
	require.NoError(t, s.MakeBucket(context.Background(), "after"))

	s.Stop()
	assert.NoFileExists(t, s.proc.record.Path(), "Stop removes the record")
	for _, sock := range s.proc.rec.Sockets {
		assert.NoFileExists(t, sock, "and the sockets")
	}
}

// TestStartRetriesOnATakenPort takes the first port Start picks before weed
// can bind it, as another process may between the pick and the bind.
func TestStartRetriesOnATakenPort(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server; skipped with -short")
	}
	ensure(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer func() { _ = l.Close() }()
	taken := l.Addr().(*net.TCPAddr).Port
	first := true
	pick = func() (int, error) {
		if first {
			first = false
			return taken, nil
		}
		return freeport.Pick()
	}
	defer func() { pick = freeport.Pick }()

	var progress bytes.Buffer
	dir := t.TempDir()
	s, err := Start(context.Background(), dir, io.MultiWriter(&progress, testWriter{t}))
	require.NoError(t, err)
	defer s.Stop()
	assert.Contains(t, progress.String(), "starting again on other ports")
	log, err := os.ReadFile(filepath.Join(dir, logName)) //nolint:gosec // the test's own file
	require.NoError(t, err)
	assert.Contains(t, string(log), "=== start 2:")
	require.NoError(t, s.MakeBucket(context.Background(), "retried"))
}

func TestWriteIdentities(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s3.json")
	require.NoError(t, writeIdentities(path, "AK", "SK"))
	b, err := os.ReadFile(path) //nolint:gosec // the test's own file
	require.NoError(t, err)
	var got map[string]any
	require.NoError(t, json.Unmarshal(b, &got))
	assert.Equal(t, map[string]any{"identities": []any{map[string]any{
		"name":        "virtfleet",
		"credentials": []any{map[string]any{"accessKey": "AK", "secretKey": "SK"}},
		"actions":     []any{"Admin", "Read", "Write", "List", "Tagging"},
	}}}, got)
	fi, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), "it holds a secret")
}
