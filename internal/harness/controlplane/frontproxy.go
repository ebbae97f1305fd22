package controlplane

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// FrontProxyName is the common name of the client certificate the API
// server's aggregator presents to aggregated API servers.
const FrontProxyName = "front-proxy-client"

// enableAggregation gives the API server what it needs to proxy to
// aggregated API servers, as kubeadm configures it: a front-proxy CA, the
// client certificate it signed, and the request headers that carry the
// user. The API server publishes the CA and the headers in
// kube-system/extension-apiserver-authentication.
func enableAggregation(s *envtest.APIServer, dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return errors.Wrap(err, "cannot create the front proxy's directory")
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return errors.Wrap(err, "cannot make the front proxy's CA key")
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "front-proxy-ca"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return errors.Wrap(err, "cannot make the front proxy's CA")
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return errors.Wrap(err, "cannot parse the front proxy's CA")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return errors.Wrap(err, "cannot make the front proxy's key")
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: FrontProxyName},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return errors.Wrap(err, "cannot make the front proxy's certificate")
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return errors.Wrap(err, "cannot encode the front proxy's key")
	}
	files := map[string]*pem.Block{
		"ca.crt":     {Type: "CERTIFICATE", Bytes: caDER},
		"client.crt": {Type: "CERTIFICATE", Bytes: der},
		"client.key": {Type: "EC PRIVATE KEY", Bytes: keyDER},
	}
	for name, block := range files {
		if err := os.WriteFile(filepath.Join(dir, name), pem.EncodeToMemory(block), 0o600); err != nil {
			return errors.Wrapf(err, "cannot write the front proxy's %s", name)
		}
	}
	args := s.Configure()
	args.Set("requestheader-client-ca-file", filepath.Join(dir, "ca.crt"))
	args.Set("requestheader-allowed-names", FrontProxyName)
	args.Set("requestheader-username-headers", "X-Remote-User")
	args.Set("requestheader-group-headers", "X-Remote-Group")
	args.Set("requestheader-extra-headers-prefix", "X-Remote-Extra-")
	args.Set("proxy-client-cert-file", filepath.Join(dir, "client.crt"))
	args.Set("proxy-client-key-file", filepath.Join(dir, "client.key"))
	return nil
}
