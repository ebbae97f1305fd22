package fleet

import (
	"context"
	"io"

	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
)

// OpenConsole opens a session to a console of a guest on node through the
// fleet's bus (bus.Bus.OpenConsole): only node's agent can answer it, and
// only the hub can open it.
func (f *Fleet) OpenConsole(ctx context.Context, node string, open wire.ConsoleOpen) (io.ReadWriteCloser, error) {
	return f.Bus.OpenConsole(ctx, node, open)
}
