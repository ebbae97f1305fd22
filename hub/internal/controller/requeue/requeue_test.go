package requeue

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
)

func TestOnConflict(t *testing.T) {
	conflict := kerrors.NewConflict(schema.GroupResource{Group: "compute.virtfleet.io", Resource: "virtualmachines"}, "vm", errors.New("the object has been modified"))
	cases := []struct {
		name    string
		res     reconcile.Result
		err     error
		want    reconcile.Result
		wantErr bool
	}{
		{"a conflict, even wrapped, runs again soon without backoff", reconcile.Result{}, errors.Wrap(conflict, "cannot update managed resource status"), reconcile.Result{RequeueAfter: ConflictDelay}, false},
		{"other errors keep their backoff", reconcile.Result{}, errors.New("cannot connect"), reconcile.Result{}, true},
		{"results pass through", reconcile.Result{RequeueAfter: time.Minute}, nil, reconcile.Result{RequeueAfter: time.Minute}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := OnConflict(reconcile.Func(func(context.Context, reconcile.Request) (reconcile.Result, error) { return tc.res, tc.err }))
			got, err := r.Reconcile(context.Background(), reconcile.Request{})
			assert.Equal(t, tc.want, got)
			assert.Equal(t, tc.wantErr, err != nil)
		})
	}
}
