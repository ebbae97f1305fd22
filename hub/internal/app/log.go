package app

import (
	"io"
	"slices"
	"sync"

	"github.com/go-logr/logr"
	uberzap "go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
)

// newLogger is the hub's logger, writing to out, at debug level if debug:
// controller-runtime's zap logger, its fields encoded lazily (lazyCore).
func newLogger(debug bool, out io.Writer) logr.Logger {
	return zap.New(zap.UseDevMode(debug), zap.WriteTo(out), zap.RawZapOpts(uberzap.WrapCore(func(c zapcore.Core) zapcore.Core {
		return &lazyCore{Core: c}
	})))
}

// lazyCore is a zapcore.Core whose With only remembers its fields; they are
// encoded when the derived logger first writes a line. The reconcilers
// derive a logger per request (crossplane-runtime's managed reconciler adds
// the request, then the object's uid, version and external name), and
// zap's own With encodes the fields at once into a copy of the encoder,
// though most requests write no line at the level the hub logs at. zap's
// NewLazyWith defers only one With: deriving from its logger again, as the
// managed reconciler does, encodes the first fields there and then.
type lazyCore struct {
	// Core is the core without fields; what is enabled is its.
	zapcore.Core
	fields []zapcore.Field

	once  sync.Once
	built zapcore.Core
}

func (c *lazyCore) With(fields []zapcore.Field) zapcore.Core {
	if len(fields) == 0 {
		return c
	}
	return &lazyCore{Core: c.Core, fields: append(slices.Clip(c.fields), fields...)}
}

// core is Core with the fields, encoded on the first call.
func (c *lazyCore) core() zapcore.Core {
	c.once.Do(func() {
		c.built = c.Core
		if len(c.fields) > 0 {
			c.built = c.Core.With(c.fields)
		}
	})
	return c.built
}

func (c *lazyCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if !c.Enabled(e.Level) {
		return ce
	}
	return c.core().Check(e, ce)
}

func (c *lazyCore) Write(e zapcore.Entry, fields []zapcore.Field) error {
	return c.core().Write(e, fields)
}

func (c *lazyCore) Sync() error { return c.core().Sync() }
