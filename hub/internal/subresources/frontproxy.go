package subresources

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"net/http"
	"slices"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// The ConfigMap in which the API server publishes how it authenticates to
// aggregated API servers, and its keys.
var authConfigMap = types.NamespacedName{Namespace: "kube-system", Name: "extension-apiserver-authentication"}

const (
	keyClientCA     = "requestheader-client-ca-file"
	keyAllowedNames = "requestheader-allowed-names"
	keyUserHeaders  = "requestheader-username-headers"
	keyGroupHeaders = "requestheader-group-headers"
)

// frontProxy is how a request proves it came through the API server: a
// client certificate signed by the request-header CA, with one of the
// allowed common names (any, when none is listed), and the user it acts
// for in the named headers.
type frontProxy struct {
	roots        *x509.CertPool
	allowedNames []string
	userHeaders  []string
	groupHeaders []string
}

// loadFrontProxy reads the API server's request-header configuration.
func (s *Server) loadFrontProxy(ctx context.Context) error {
	cm := &corev1.ConfigMap{}
	if err := s.direct.Get(ctx, authConfigMap, cm); err != nil {
		return errors.Wrapf(err, "cannot get ConfigMap %s", authConfigMap)
	}
	fp, err := parseFrontProxy(cm.Data)
	if err != nil {
		return errors.Wrapf(err, "cannot read ConfigMap %s", authConfigMap)
	}
	s.front.Store(fp)
	return nil
}

func parseFrontProxy(data map[string]string) (*frontProxy, error) {
	ca := data[keyClientCA]
	if ca == "" {
		return nil, errors.Errorf("%s is empty: the API server runs without --requestheader-client-ca-file, so it cannot aggregate APIs", keyClientCA)
	}
	fp := &frontProxy{roots: x509.NewCertPool()}
	if !fp.roots.AppendCertsFromPEM([]byte(ca)) {
		return nil, errors.Errorf("%s holds no certificate", keyClientCA)
	}
	for key, into := range map[string]*[]string{keyAllowedNames: &fp.allowedNames, keyUserHeaders: &fp.userHeaders, keyGroupHeaders: &fp.groupHeaders} {
		if v := data[key]; v != "" {
			if err := json.Unmarshal([]byte(v), into); err != nil {
				return nil, errors.Wrapf(err, "cannot parse %s", key)
			}
		}
	}
	if len(fp.userHeaders) == 0 {
		return nil, errors.Errorf("%s is empty: requests would carry no user", keyUserHeaders)
	}
	return fp, nil
}

// user is the user the API server authenticated, when r came through it.
type user struct {
	Name   string
	Groups []string
}

// authenticate returns the user r acts for, or an error when r did not come
// through the API server's front proxy.
func (fp *frontProxy) authenticate(r *http.Request) (user, error) {
	if fp == nil {
		return user{}, errors.New("the front proxy's CA is not loaded yet")
	}
	if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
		return user{}, errors.New("no client certificate: only the Kubernetes API server may call this server")
	}
	leaf := r.TLS.PeerCertificates[0]
	inter := x509.NewCertPool()
	for _, c := range r.TLS.PeerCertificates[1:] {
		inter.AddCert(c)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: fp.roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		return user{}, errors.Wrap(err, "the client certificate is not the API server's front proxy's")
	}
	if len(fp.allowedNames) > 0 && !slices.Contains(fp.allowedNames, leaf.Subject.CommonName) {
		return user{}, errors.Errorf("client certificate %q is not an allowed front proxy", leaf.Subject.CommonName)
	}
	var u user
	for _, h := range fp.userHeaders {
		if u.Name = r.Header.Get(h); u.Name != "" {
			break
		}
	}
	if u.Name == "" {
		return user{}, errors.New("the request names no user")
	}
	for _, h := range fp.groupHeaders {
		u.Groups = append(u.Groups, r.Header.Values(h)...)
	}
	return u, nil
}
