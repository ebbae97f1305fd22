package modbuild

import (
	"bytes"
	"context"
	"path/filepath"
	"testing"
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
