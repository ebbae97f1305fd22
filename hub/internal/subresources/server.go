// Package subresources serves virtfleet's aggregated API,
// subresources.virtfleet.io: the ways into a VirtualMachine that are not
// fields of it — its serial console and VNC display as streams, and
// start, stop, restart, reset, pause, unpause and migrate as actions — in
// the shape KubeVirt's virt-api gives virtualmachines and
// virtualmachineinstances.
//
// The Kubernetes API server authenticates the user and authorizes the
// subresource with RBAC (virtualmachines/console, verb get;
// virtualmachines/pause, verb update; …) before it proxies the request
// here, so a tenant reaches only what its Roles allow, in its own
// namespaces. This server accepts only requests the API server's front
// proxy signed (its client certificate, checked against the request-header
// CA the API server publishes in kube-system/extension-apiserver-
// authentication), and acts with the hub's own rights on the one VM the
// request names. Streams come from the agent of the VM's node over NATS
// (natswire.DialConsole), never through etcd.
package subresources

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/event"
	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/fleet"
)

// The aggregated API's group and version, and the name of its APIService.
const (
	Group          = "subresources.virtfleet.io"
	Version        = "v1alpha1"
	APIServiceName = Version + "." + Group
)

// DefaultSessions is how many console and VNC sessions one hub replica
// relays at once.
const DefaultSessions = 64

// DefaultSessionsPerNamespace is how many of them the VMs of one namespace
// may hold: a quarter, so that one tenant holding every console it may
// still leaves the hub to the others.
const DefaultSessionsPerNamespace = DefaultSessions / 4

// Options configure the Server.
type Options struct {
	// Address the server listens on (host:port).
	Address string
	// TLSSecret holds the serving certificate (tls.crt, tls.key) and the
	// CA that signed it (ca.crt). The hub creates it when it is missing or
	// no longer fits, and every replica serves the same one.
	TLSSecret types.NamespacedName
	// APIService is the APIService that routes the group here; the hub
	// keeps its caBundle in step with TLSSecret's CA and names its
	// certificate after the Service it points to.
	APIService string
	// Sessions bounds the console and VNC sessions relayed at once; 0
	// means DefaultSessions.
	Sessions int
	// SessionsPerNamespace bounds the sessions of the VMs of one namespace
	// among them; 0 means DefaultSessionsPerNamespace.
	SessionsPerNamespace int
	// Refresh is how often the certificate, the APIService's caBundle and
	// the front proxy's CA are checked; 0 means a minute.
	Refresh time.Duration
}

// Fleets finds the fleet a VM belongs to (its ProviderConfig's NATS).
type Fleets func(ctx context.Context, vm *v1alpha1.VirtualMachine) (*fleet.Fleet, error)

// Server is the aggregated API server. It runs on every hub replica: the
// API server reaches any of them through the APIService's Service.
type Server struct {
	opts Options
	// kube reads VMs from the cache and writes through the API server.
	kube client.Client
	// direct reads what the hub does not cache (Secrets, the APIService,
	// the front proxy's ConfigMap).
	direct   client.Reader
	fleets   Fleets
	log      logging.Logger
	recorder event.Recorder

	cert     atomic.Pointer[tls.Certificate]
	front    atomic.Pointer[frontProxy]
	sessions *sessionSlots
}

// New returns a Server; Start runs it.
func New(o Options, kube client.Client, direct client.Reader, fleets Fleets, log logging.Logger, recorder event.Recorder) *Server {
	if o.Sessions <= 0 {
		o.Sessions = DefaultSessions
	}
	if o.SessionsPerNamespace <= 0 {
		o.SessionsPerNamespace = DefaultSessionsPerNamespace
	}
	if o.Refresh <= 0 {
		o.Refresh = time.Minute
	}
	if o.APIService == "" {
		o.APIService = APIServiceName
	}
	return &Server{opts: o, kube: kube, direct: direct, fleets: fleets, log: log, recorder: recorder, sessions: newSessionSlots(o.Sessions, o.SessionsPerNamespace)}
}

// NeedLeaderElection is false: every replica serves, as the APIService's
// Service may send a request to any of them.
func (s *Server) NeedLeaderElection() bool { return false }

// Start serves until ctx is done. It first makes sure of its certificate
// and the front proxy's CA, so the API server never meets a replica that
// cannot answer; then it keeps both current.
func (s *Server) Start(ctx context.Context) error {
	if err := s.untilReady(ctx); err != nil {
		return err
	}
	l, err := net.Listen("tcp", s.opts.Address)
	if err != nil {
		return errors.Wrapf(err, "cannot listen on %s", s.opts.Address)
	}
	srv := &http.Server{
		Handler:           s.routes(),
		ReadHeaderTimeout: 10 * time.Second,
		TLSConfig: &tls.Config{
			MinVersion: tls.VersionTLS12,
			GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
				return s.cert.Load(), nil
			},
			// The front proxy's certificate is verified per request
			// against the CA the API server publishes, which may change
			// while the listener lives.
			ClientAuth: tls.RequestClientCert,
		},
	}
	go func() {
		t := time.NewTicker(s.opts.Refresh)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				shut, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				_ = srv.Shutdown(shut)
				cancel()
				return
			case <-t.C:
				if err := s.refresh(ctx); err != nil {
					s.log.Info("Cannot refresh the aggregated API's certificates", "error", err)
				}
			}
		}
	}()
	s.log.Info("Serving the aggregated API", "address", l.Addr().String(), "group", Group)
	if err := srv.ServeTLS(l, "", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return errors.Wrap(err, "aggregated API server stopped")
	}
	return nil
}

// refresh makes sure of the serving certificate, the APIService's caBundle
// and the front proxy's CA.
func (s *Server) refresh(ctx context.Context) error {
	if err := s.ensureServing(ctx); err != nil {
		return err
	}
	return s.loadFrontProxy(ctx)
}

// untilReady refreshes until it succeeds or ctx ends, saying why each
// attempt failed.
func (s *Server) untilReady(ctx context.Context) error {
	delay := time.Second
	for {
		err := s.refresh(ctx)
		if err == nil {
			return nil
		}
		s.log.Info("The aggregated API is not ready yet", "error", err)
		select {
		case <-ctx.Done():
			return errors.Wrap(err, "the aggregated API never got ready")
		case <-time.After(delay):
		}
		delay = min(2*delay, s.opts.Refresh)
	}
}
