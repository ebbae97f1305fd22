package wsconsole

import (
	"net/http"
	"net/url"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"k8s.io/client-go/rest"
)

// KubeOptions are the Options that open a WebSocket at u, a stream
// subresource of a Kubernetes API server (KubeVirt's console, virtfleet's),
// authenticated as client-go authenticates cfg's requests: its TLS
// configuration (client certificates included), the headers its
// authentication adds (a bearer token, basic auth, an exec plugin's token,
// impersonation) and its proxy.
func KubeOptions(cfg *rest.Config, u *url.URL, subprotocol string) (Options, error) {
	tlsConfig, err := rest.TLSConfigFor(cfg)
	if err != nil {
		return Options{}, errors.Wrap(err, "cannot configure TLS for the API server")
	}
	var header http.Header
	rt, err := rest.HTTPWrappersForConfig(cfg, roundTripper(func(r *http.Request) (*http.Response, error) {
		header = r.Header.Clone()
		return &http.Response{StatusCode: http.StatusNoContent, Body: http.NoBody, Request: r}, nil
	}))
	if err != nil {
		return Options{}, errors.Wrap(err, "cannot configure authentication to the API server")
	}
	req, err := http.NewRequest(http.MethodGet, u.String(), nil) //nolint:noctx // never sent: the wrappers only add headers
	if err != nil {
		return Options{}, errors.Wrap(err, "cannot build the stream's request")
	}
	resp, err := rt.RoundTrip(req)
	if err != nil {
		return Options{}, errors.Wrap(err, "cannot authenticate to the API server")
	}
	_ = resp.Body.Close()
	proxy := cfg.Proxy
	if proxy == nil {
		proxy = http.ProxyFromEnvironment
	}
	return Options{Subprotocol: subprotocol, TLS: tlsConfig, Header: header, Proxy: proxy}, nil
}

// KubeURL is the WebSocket URL of an API server's URL u: ws for http, wss
// otherwise.
func KubeURL(u *url.URL) *url.URL {
	ws := *u
	ws.RawQuery = ""
	if ws.Scheme == "http" {
		ws.Scheme = "ws"
	} else {
		ws.Scheme = "wss"
	}
	return &ws
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
