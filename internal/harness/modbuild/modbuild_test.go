package modbuild

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"testing/fstest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestLock(t *testing.T) {
	path := filepath.Join(t.TempDir(), ".lock")
	unlock, err := Lock(context.Background(), path, &bytes.Buffer{})
	require.NoError(t, err)

	t.Run("AWaiterSaysSoAndStopsWithItsContext", func(t *testing.T) {
		var progress bytes.Buffer
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		_, err := Lock(ctx, path, &progress)
		assert.ErrorIs(t, err, context.DeadlineExceeded)
		assert.Contains(t, progress.String(), "waiting for "+path+", which another build or run holds")
	})

	t.Run("AWaiterGetsTheLockOnceReleased", func(t *testing.T) {
		got := make(chan error, 1)
		go func() {
			u, err := Lock(context.Background(), path, &bytes.Buffer{})
			if err == nil {
				u()
			}
			got <- err
		}()
		unlock()
		select {
		case err := <-got:
			assert.NoError(t, err)
		case <-time.After(10 * time.Second):
			t.Fatal("the waiter never got the released lock")
		}
	})
}

func TestCopySource(t *testing.T) {
	cases := []struct {
		name    string
		src     fstest.MapFS
		want    []string
		wantErr string
	}{
		{
			name: "the Go files are named for the build and every file is copied",
			src: fstest.MapFS{
				"main.go":   {Data: []byte("//go:build ignore\n\npackage main\n")},
				"flags.go":  {Data: []byte("package main\n")},
				"README.md": {Data: []byte("notes")},
			},
			want: []string{"flags.go", "main.go"},
		},
		{
			name:    "a source without Go files is an error",
			src:     fstest.MapFS{"README.md": {Data: []byte("notes")}},
			wantErr: "no Go files",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			got, err := copySource(tc.src, dir)
			if tc.wantErr != "" {
				assert.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
			for name, f := range tc.src {
				b, err := os.ReadFile(filepath.Join(dir, name))
				require.NoError(t, err)
				assert.Equal(t, f.Data, b)
			}
		})
	}
}
