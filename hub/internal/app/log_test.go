package app

import (
	"bytes"
	"io"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// encodings counts how often it was encoded into a line.
type encodings struct{ n int }

func (e *encodings) String() string { e.n++; return "uid" }

func TestLazyCoreEncodesFieldsOnlyForALine(t *testing.T) {
	cases := map[string]struct {
		lines     func(l *zap.Logger)
		wantCalls int
		wantOut   []string
	}{
		"NoLine": {
			lines: func(*zap.Logger) {},
		},
		"ADisabledLine": {
			lines: func(l *zap.Logger) { l.Debug("not at this level") },
		},
		"TwoLines": {
			lines: func(l *zap.Logger) {
				l.Info("first", zap.String("c", "3"))
				l.Info("second")
			},
			wantCalls: 1,
			wantOut:   []string{`"msg":"first","a":"1","b":"uid","c":"3"`, `"msg":"second","a":"1","b":"uid"`},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			var out bytes.Buffer
			enc := zapcore.NewJSONEncoder(zapcore.EncoderConfig{MessageKey: "msg"})
			base := zap.New(&lazyCore{Core: zapcore.NewCore(enc, zapcore.AddSync(&out), zapcore.InfoLevel)})
			uid := &encodings{}
			// Derived twice, as crossplane-runtime's managed reconciler
			// derives its logger per request.
			tc.lines(base.With(zap.String("a", "1")).With(zap.Stringer("b", uid)))
			assert.Equal(t, tc.wantCalls, uid.n, "times the fields were encoded")
			lines := bytes.Split(bytes.TrimSpace(out.Bytes()), []byte("\n"))
			if len(tc.wantOut) == 0 {
				assert.Empty(t, out.String())
				return
			}
			require.Len(t, lines, len(tc.wantOut))
			for i, want := range tc.wantOut {
				assert.Contains(t, string(lines[i]), want)
			}
		})
	}
}

// BenchmarkPerRequestLogger derives a logger as crossplane-runtime's
// managed reconciler does for each request, at a level that writes no line,
// from zap's own core and from a lazyCore.
func BenchmarkPerRequestLogger(b *testing.B) {
	cores := map[string]func(zapcore.Core) zapcore.Core{
		"Zap":  func(c zapcore.Core) zapcore.Core { return c },
		"Lazy": func(c zapcore.Core) zapcore.Core { return &lazyCore{Core: c} },
	}
	for name, wrap := range cores {
		b.Run(name, func(b *testing.B) {
			enc := zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig())
			l := zap.New(wrap(zapcore.NewCore(enc, zapcore.AddSync(io.Discard), zapcore.InfoLevel))).With(zap.String("controller", "managed/virtualmachine"))
			b.ReportAllocs()
			for b.Loop() {
				r := l.With(zap.String("request", "team-a/vm-0001"))
				r = r.With(zap.String("uid", "5c0e5bd6-8d3c-4be0-9d6e-0a3c1d7b8a11"), zap.String("version", "123456"), zap.String("external-name", "vm-0001"))
				r.Debug("Reconciling")
			}
		})
	}
}
