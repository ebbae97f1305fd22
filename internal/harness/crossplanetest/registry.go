package crossplanetest

import (
	"context"
	"io"
	"log"
	"net"
	"net/http"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
)

// Registry is an OCI registry in this process on 127.0.0.1, which
// Crossplane's package manager pulls from over plain HTTP (go-containerregistry
// speaks HTTP to loopback registries).
type Registry struct {
	// Host is host:port, the registry part of a package reference.
	Host string
	srv  *http.Server
}

// StartRegistry starts an empty registry on a free port of 127.0.0.1.
func StartRegistry() (*Registry, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, errors.Wrap(err, "cannot listen for the registry")
	}
	r := &Registry{
		Host: l.Addr().String(),
		srv: &http.Server{
			Handler:           registry.New(registry.Logger(log.New(io.Discard, "", 0))),
			ReadHeaderTimeout: 10 * time.Second,
		},
	}
	go func() { _ = r.srv.Serve(l) }()
	return r, nil
}

// Push pushes img as repository:tag and returns the reference a package's
// spec.package names.
func (r *Registry) Push(ctx context.Context, repository, tag string, img v1.Image) (string, error) {
	ref, err := name.NewTag(r.Host + "/" + repository + ":" + tag)
	if err != nil {
		return "", errors.Wrap(err, "cannot make the package reference")
	}
	if err := remote.Write(ref, img, remote.WithContext(ctx)); err != nil {
		return "", errors.Wrapf(err, "cannot push %s", ref)
	}
	return ref.String(), nil
}

// Stop stops the registry.
func (r *Registry) Stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = r.srv.Shutdown(ctx)
}
