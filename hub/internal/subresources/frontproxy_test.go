package subresources

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// testCA signs client certificates for the tests.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

func newTestCA(t *testing.T) testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "ca"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	return testCA{cert: cert, key: key}
}

func (ca testCA) pem() string {
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.cert.Raw}))
}

func (ca testCA) client(t *testing.T, cn string, usage x509.ExtKeyUsage) *x509.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: cn}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	return cert
}

func TestFrontProxy(t *testing.T) {
	ca, other := newTestCA(t), newTestCA(t)
	fp, err := parseFrontProxy(map[string]string{
		keyClientCA:     ca.pem(),
		keyAllowedNames: `["front-proxy-client"]`,
		keyUserHeaders:  `["X-Remote-User"]`,
		keyGroupHeaders: `["X-Remote-Group"]`,
	})
	require.NoError(t, err)
	request := func(cert *x509.Certificate, user string, groups ...string) *http.Request {
		r := httptest.NewRequest(http.MethodGet, "/apis", nil)
		if cert != nil {
			r.TLS = &tls.ConnectionState{PeerCertificates: []*x509.Certificate{cert}}
		}
		if user != "" {
			r.Header.Set("X-Remote-User", user)
		}
		for _, g := range groups {
			r.Header.Add("X-Remote-Group", g)
		}
		return r
	}
	cases := map[string]struct {
		r       *http.Request
		want    user
		refused string
	}{
		"TheAPIServersProxyActsForItsUser": {r: request(ca.client(t, "front-proxy-client", x509.ExtKeyUsageClientAuth), "alice", "dev", "system:authenticated"), want: user{Name: "alice", Groups: []string{"dev", "system:authenticated"}}},
		"NoCertificate":                    {r: request(nil, "system:admin"), refused: "only the Kubernetes API server"},
		"AnotherCA":                        {r: request(other.client(t, "front-proxy-client", x509.ExtKeyUsageClientAuth), "system:admin"), refused: "not the API server's front proxy"},
		"AServerCertificate":               {r: request(ca.client(t, "front-proxy-client", x509.ExtKeyUsageServerAuth), "system:admin"), refused: "not the API server's front proxy"},
		"ANameNotAllowed":                  {r: request(ca.client(t, "kubelet", x509.ExtKeyUsageClientAuth), "system:admin"), refused: "not an allowed front proxy"},
		"NoUser":                           {r: request(ca.client(t, "front-proxy-client", x509.ExtKeyUsageClientAuth), ""), refused: "names no user"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			u, err := fp.authenticate(tc.r)
			if tc.refused != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.refused)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, u)
		})
	}
	t.Run("NotLoadedYet", func(t *testing.T) {
		var none *frontProxy
		_, err := none.authenticate(request(ca.client(t, "front-proxy-client", x509.ExtKeyUsageClientAuth), "alice"))
		assert.Error(t, err)
	})
}

func TestParseFrontProxyRefuses(t *testing.T) {
	ca := newTestCA(t)
	cases := map[string]map[string]string{
		"NoCA":             {keyUserHeaders: `["X-Remote-User"]`},
		"NotACertificate":  {keyClientCA: "junk", keyUserHeaders: `["X-Remote-User"]`},
		"NoUserHeaders":    {keyClientCA: ca.pem()},
		"MalformedHeaders": {keyClientCA: ca.pem(), keyUserHeaders: `X-Remote-User`},
	}
	for name, data := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := parseFrontProxy(data)
			assert.Error(t, err)
		})
	}
}
