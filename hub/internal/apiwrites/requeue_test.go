package apiwrites

import (
	"testing"

	"github.com/stretchr/testify/assert"
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
