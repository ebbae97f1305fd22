package nova

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestLockLivesOnlyWhileUsed pins that a uid's calls take turns, other uids'
// calls do not wait for them, and a uid's lock is gone once no call holds or
// waits for it (kept, the map grew with every VM the node ever served).
func TestLockLivesOnlyWhileUsed(t *testing.T) {
	d := &Driver{locks: map[string]*uidLock{}}
	users := func(uid string) int {
		d.locksMu.Lock()
		defer d.locksMu.Unlock()
		if l, ok := d.locks[uid]; ok {
			return l.users
		}
		return 0
	}

	unlockA := d.lock("a")
	unlockB := d.lock("b") // would deadlock if b waited for a
	assert.False(t, d.locks["a"].TryLock(), "a is held")

	second := make(chan func())
	go func() { second <- d.lock("a") }()
	require.Eventually(t, func() bool { return users("a") == 2 }, 5*time.Second, time.Millisecond, "the second call never waited")
	select {
	case <-second:
		t.Fatal("the second call for a did not wait for the first")
	default:
	}

	unlockA()
	unlockA2 := <-second
	assert.Equal(t, 1, users("a"), "the lock stays while its second call holds it")
	unlockA2()
	unlockB()
	assert.Empty(t, d.locks, "no lock outlives its calls")
}
