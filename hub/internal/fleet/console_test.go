package fleet

import (
	"context"
	"io"
	"testing"

	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/bus"
)

func TestOpenConsoleGoesThroughTheBus(t *testing.T) {
	b := bus.NewFake()
	stream := &struct{ io.ReadWriteCloser }{}
	var gotNode string
	var gotOpen wire.ConsoleOpen
	b.Consoles = func(node string, o wire.ConsoleOpen) (io.ReadWriteCloser, error) {
		gotNode, gotOpen = node, o
		return stream, nil
	}
	f := New(b, logging.NewNopLogger())

	open := wire.ConsoleOpen{Session: "s1", UID: "vm-a", Kind: wire.ConsoleSerial}
	s, err := f.OpenConsole(context.Background(), "node-1.rack-a", open)
	require.NoError(t, err)
	assert.Same(t, stream, s)
	assert.Equal(t, "node-1.rack-a", gotNode, "the node is named as Kubernetes names it")
	open.ProtocolVersion = wire.ProtocolVersion
	assert.Equal(t, open, gotOpen)
}
