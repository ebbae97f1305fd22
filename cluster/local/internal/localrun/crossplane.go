//go:build crossplane

package localrun

import (
	"context"

	"github.com/virtfleet/virtfleet/internal/harness/crossplanetest"
	"github.com/virtfleet/virtfleet/internal/harness/stack"
)

// make run CROSSPLANE=1 builds bin/local with the crossplane tag, and so
// with this file.
func init() {
	withCrossplane = func(ctx context.Context, so stack.Options) (stack.Options, crossplaneCore, error) {
		var c *crossplanetest.Crossplane
		so, err := crossplanetest.StackOptions(ctx, so, &c)
		if c == nil {
			// No core started: a nil interface, not a nil pointer in one.
			return so, nil, err
		}
		return so, c, err
	}
}
