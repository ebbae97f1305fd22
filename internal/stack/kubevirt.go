package stack

import (
	"context"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
)

// startKubeVirt starts a KubeVirt test cluster for node. Not built yet.
func startKubeVirt(_ context.Context, node, _ string) (Backend, error) {
	return nil, errors.Errorf("node %s: the kubevirt test backend is not built yet", node)
}
