package subresources

import (
	"context"
	"crypto/x509"
	"testing"

	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
)

func TestEnsureServing(t *testing.T) {
	ctx := context.Background()
	scheme := runtime.NewScheme()
	require.NoError(t, clientgoscheme.AddToScheme(scheme))
	require.NoError(t, apiregistrationv1.AddToScheme(scheme))
	svc := &apiregistrationv1.APIService{
		ObjectMeta: metav1.ObjectMeta{Name: APIServiceName},
		Spec:       apiregistrationv1.APIServiceSpec{Group: Group, Version: Version, Service: &apiregistrationv1.ServiceReference{Namespace: "vf", Name: "api"}},
	}
	kube := fake.NewClientBuilder().WithScheme(scheme).WithObjects(svc).Build()
	secret := types.NamespacedName{Namespace: "vf", Name: "api-tls"}
	s := New(Options{TLSSecret: secret}, kube, kube, nil, logging.NewNopLogger(), nil)

	require.NoError(t, s.ensureServing(ctx))
	first := s.cert.Load()
	require.NotNil(t, first)
	stored := &corev1.Secret{}
	require.NoError(t, kube.Get(ctx, secret, stored))
	require.NoError(t, kube.Get(ctx, types.NamespacedName{Name: APIServiceName}, svc))
	assert.Equal(t, stored.Data["ca.crt"], svc.Spec.CABundle, "the APIService trusts the CA that signed the certificate")

	leaf, err := x509.ParseCertificate(first.Certificate[0])
	require.NoError(t, err)
	roots := x509.NewCertPool()
	require.True(t, roots.AppendCertsFromPEM(svc.Spec.CABundle))
	_, err = leaf.Verify(x509.VerifyOptions{DNSName: "api.vf.svc", Roots: roots})
	assert.NoError(t, err, "the certificate names the Service the API server dials")

	require.NoError(t, s.ensureServing(ctx))
	assert.Equal(t, first.Certificate, s.cert.Load().Certificate, "a certificate that still fits is kept")

	// The APIService now routes to another Service: its name must be on
	// the certificate, or the API server's proxy refuses it.
	svc.Spec.Service.Name = "moved"
	require.NoError(t, kube.Update(ctx, svc))
	require.NoError(t, s.ensureServing(ctx))
	leaf, err = x509.ParseCertificate(s.cert.Load().Certificate[0])
	require.NoError(t, err)
	require.NoError(t, kube.Get(ctx, types.NamespacedName{Name: APIServiceName}, svc))
	roots = x509.NewCertPool()
	require.True(t, roots.AppendCertsFromPEM(svc.Spec.CABundle))
	_, err = leaf.Verify(x509.VerifyOptions{DNSName: "moved.vf.svc", Roots: roots})
	assert.NoError(t, err)
}
