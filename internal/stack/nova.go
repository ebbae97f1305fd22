package stack

import (
	"context"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
)

// startNova starts an OpenStack API test server for node. Not built yet.
func startNova(_ context.Context, node, _ string) (Backend, error) {
	return nil, errors.Errorf("node %s: the nova test backend is not built yet", node)
}
