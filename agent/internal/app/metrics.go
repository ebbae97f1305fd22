package app

import (
	"context"
	"net"
	"net/http"
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
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, errors.Wrap(err, "--metrics-bind-address")
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			log.Info("Metrics endpoint stopped", "error", err)
		}
	}()
	log.Info("Serving metrics", "address", ln.Addr().String(), "path", "/metrics")
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), metricsShutdown)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			log.Debug("Cannot stop the metrics endpoint cleanly", "error", err)
		}
		<-done
	}, nil
}
