package benchmark

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestProgressSaysHowFarARunIs(t *testing.T) {
	tr := newTracker(3)
	start := time.Now()
	for _, n := range []string{"vm-0", "vm-1", "vm-2"} {
		tr.markCreated(n, start)
	}
	tr.markRunning("vm-0", start)

	var (
		mu    sync.Mutex
		lines []string
	)
	progress := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		lines = append(lines, fmt.Sprintf(format, args...))
	}
	stopped := make(chan struct{})
	go func() {
		tr.report(context.Background(), start, 20*time.Millisecond, progress)
		close(stopped)
	}()
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(lines) > 0 }, 5*time.Second, 10*time.Millisecond)
	mu.Lock()
	assert.Contains(t, lines[0], "3 of 3 created, 1 Running")
	mu.Unlock()

	tr.markRunning("vm-1", time.Now())
	tr.markRunning("vm-2", time.Now())
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		t.Fatal("the progress display did not stop once every VM was Running")
	}
}
