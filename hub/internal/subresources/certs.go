package subresources

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	certutil "k8s.io/client-go/util/cert"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
)

// ServiceName is the Service cluster/deploy routes the APIService to, in the
// hub's namespace; the certificate names it while no APIService says.
const ServiceName = "virtfleet-hub-api"

// renewBefore is how long before its end a serving certificate is replaced.
const renewBefore = 30 * 24 * time.Hour

// ensureServing loads the serving certificate from the Secret, making a new
// one when it is missing, expires soon or does not name the APIService's
// Service, and puts its CA into the APIService's caBundle.
func (s *Server) ensureServing(ctx context.Context) error {
	svc := &apiregistrationv1.APIService{}
	err := s.direct.Get(ctx, types.NamespacedName{Name: s.opts.APIService}, svc)
	if err != nil && !kerrors.IsNotFound(err) {
		return errors.Wrapf(err, "cannot get APIService %s", s.opts.APIService)
	}
	registered := err == nil
	// The API server's proxy checks the certificate against the name of
	// the Service the APIService routes to.
	host := ServiceName + "." + s.opts.TLSSecret.Namespace + ".svc"
	if registered && svc.Spec.Service != nil {
		host = svc.Spec.Service.Name + "." + svc.Spec.Service.Namespace + ".svc"
	}
	cert, ca, err := s.servingSecret(ctx, host)
	if err != nil {
		return err
	}
	s.cert.Store(cert)
	if !registered || bytes.Equal(svc.Spec.CABundle, ca) {
		return nil
	}
	svc.Spec.CABundle = ca
	return errors.Wrapf(s.kube.Update(ctx, svc), "cannot put the CA into APIService %s", s.opts.APIService)
}

// servingSecret returns the Secret's certificate and CA, replacing them when
// they do not serve host for at least renewBefore.
func (s *Server) servingSecret(ctx context.Context, host string) (*tls.Certificate, []byte, error) {
	sec := &corev1.Secret{}
	err := s.direct.Get(ctx, s.opts.TLSSecret, sec)
	switch {
	case kerrors.IsNotFound(err):
		sec = &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: s.opts.TLSSecret.Namespace, Name: s.opts.TLSSecret.Name}, Type: corev1.SecretTypeTLS}
	case err != nil:
		return nil, nil, errors.Wrapf(err, "cannot get Secret %s", s.opts.TLSSecret)
	}
	if cert, ok := serves(sec, host); ok {
		return cert, sec.Data["ca.crt"], nil
	}
	chain, key, err := certutil.GenerateSelfSignedCertKey(host, nil, []string{host, host + ".cluster.local"})
	if err != nil {
		return nil, nil, errors.Wrap(err, "cannot make a serving certificate")
	}
	ca, err := lastPEM(chain)
	if err != nil {
		return nil, nil, err
	}
	sec.Data = map[string][]byte{corev1.TLSCertKey: chain, corev1.TLSPrivateKeyKey: key, "ca.crt": ca}
	if sec.ResourceVersion == "" {
		err = s.kube.Create(ctx, sec)
	} else {
		err = s.kube.Update(ctx, sec)
	}
	if err != nil {
		// Another replica made one at the same moment: take it next time.
		return nil, nil, errors.Wrapf(err, "cannot store the serving certificate in Secret %s", s.opts.TLSSecret)
	}
	cert, err := tls.X509KeyPair(chain, key)
	return &cert, ca, errors.Wrap(err, "cannot load the new serving certificate")
}

// serves says whether the Secret holds a certificate for host, valid for at
// least renewBefore, signed by its ca.crt.
func serves(sec *corev1.Secret, host string) (*tls.Certificate, bool) {
	cert, err := tls.X509KeyPair(sec.Data[corev1.TLSCertKey], sec.Data[corev1.TLSPrivateKeyKey])
	if err != nil || len(cert.Certificate) == 0 {
		return nil, false
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil || time.Until(leaf.NotAfter) < renewBefore {
		return nil, false
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(sec.Data["ca.crt"]) {
		return nil, false
	}
	if _, err := leaf.Verify(x509.VerifyOptions{DNSName: host, Roots: roots}); err != nil {
		return nil, false
	}
	return &cert, true
}

// lastPEM is the last PEM block of b: client-go's self-signed chain puts the
// CA after the serving certificate.
func lastPEM(b []byte) ([]byte, error) {
	var last *pem.Block
	for {
		var block *pem.Block
		block, b = pem.Decode(b)
		if block == nil {
			break
		}
		last = block
	}
	if last == nil {
		return nil, errors.New("the generated certificate chain holds no certificate")
	}
	return pem.EncodeToMemory(last), nil
}
