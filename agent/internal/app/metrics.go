package app

import (
	"context"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/virtfleet/virtfleet/internal/metrics"
)

// metricsShutdown bounds how long a stopping agent waits for a scrape in
// flight.
const metricsShutdown = 5 * time.Second

// metricsDisabled is the --metrics-bind-address that serves no metrics.
const metricsDisabled = "0"

// serveMetrics starts serving /metrics on addr and returns the function
// that stops it. An empty addr, or "0", serves nothing. It fails when addr
// cannot be listened on: an operator who asked for metrics learns at once
// that there are none.
//
// The registry is the agent's own, made here, not the process's default:
// it holds the agent's metrics and the Go runtime's and the process's, and
// a second agent in the same process (tests) registers into its own.
func serveMetrics(addr string, m *metrics.AgentMetrics, log logging.Logger) (stop func(), err error) {
	if addr == "" || addr == metricsDisabled {
		return func() {}, nil
	}
	reg := prometheus.NewRegistry()
	for _, c := range append(m.Collectors(), collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})) {
		if err := reg.Register(c); err != nil {
			return nil, errors.Wrap(err, "cannot register the agent's metrics")
		}
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	return serveHTTP(addr, "--metrics-bind-address", "/metrics", mux, log)
}

// servePprof serves Go's profiles under /debug/pprof/ on addr, as the hub's
// --pprof-bind-address does, and returns the function that stops it. An
// empty addr serves nothing, the default: the profiles show the agent's
// insides to whoever reaches addr.
func servePprof(addr string, log logging.Logger) (stop func(), err error) {
	if addr == "" {
		return func() {}, nil
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return serveHTTP(addr, "--pprof-bind-address", "/debug/pprof/", mux, log)
}

// serveHTTP serves h on addr, set by flag, until the returned function is
// called.
func serveHTTP(addr, flag, path string, h http.Handler, log logging.Logger) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, errors.Wrap(err, flag)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			log.Info("HTTP endpoint stopped", "path", path, "error", err)
		}
	}()
	log.Info("Serving "+path, "address", ln.Addr().String())
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), metricsShutdown)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			log.Debug("Cannot stop an HTTP endpoint cleanly", "path", path, "error", err)
		}
		<-done
	}, nil
}
