package apiwrites

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

func TestControllerRateLimiter(t *testing.T) {
	l := ControllerRateLimiter()
	req := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "default", Name: "vm"}}
	assert.Equal(t, BaseDelay, l.When(req), "a lost conflict is retried at once, not after a second")
	assert.Equal(t, 2*BaseDelay, l.When(req), "repeated failures back off")
	for range 20 {
		l.When(req)
	}
	assert.Equal(t, MaxDelay, l.When(req), "backoff is capped")
	l.Forget(req)
	assert.Equal(t, BaseDelay, l.When(req), "a success resets it")
}

func TestRetryQuietlyReadsAsAConflictAndKeepsTheError(t *testing.T) {
	cause := errors.New("the hub has not read its records yet")
	err := RetryQuietly(fmt.Errorf("cannot observe: %w", cause))
	assert.True(t, kerrors.IsConflict(err), "crossplane-runtime requeues a conflict without a word")
	assert.ErrorIs(t, err, cause)
	assert.Equal(t, "cannot observe: the hub has not read its records yet", err.Error())
	assert.NoError(t, RetryQuietly(nil))
}
