package controllertest

import (
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	apisv1alpha1 "github.com/virtfleet/virtfleet/apis/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/backupstore"
	"github.com/virtfleet/virtfleet/internal/harness/s3test"
)

// credentialsNamespace holds the Secrets of the BackupLocations an Env
// makes.
const credentialsNamespace = "virtfleet-system"

// BackupLocation makes BackupLocation name, on a new bucket of s3 of the
// same name, its credentials Secret, and a grant of it to namespaces,
// which it creates; it returns the location's store, opened as the hub
// and the nodes open it.
func (e *Env) BackupLocation(t *testing.T, s3 *s3test.Server, name string, namespaces ...string) *backupstore.Store {
	t.Helper()
	require.NoError(t, s3.MakeBucket(e.Ctx, name))
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: credentialsNamespace}}
	if err := e.Kube.Create(e.Ctx, ns); !kerrors.IsAlreadyExists(err) {
		require.NoError(t, err)
	}
	require.NoError(t, e.Kube.Create(e.Ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: credentialsNamespace, Name: name},
		Data:       map[string][]byte{v1alpha1.BackupAccessKeyID: []byte(s3.AccessKey), v1alpha1.BackupSecretAccessKey: []byte(s3.SecretKey)},
	}))
	require.NoError(t, e.Kube.Create(e.Ctx, &v1alpha1.BackupLocation{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1alpha1.BackupLocationSpec{
		Endpoint: s3.Endpoint, Insecure: true, Region: s3.Region, Bucket: name,
		CredentialsSecretRef: xpv2.SecretReference{Namespace: credentialsNamespace, Name: name},
	}}))
	require.NoError(t, e.Kube.Create(e.Ctx, &apisv1alpha1.ClusterProviderConfig{
		ObjectMeta: metav1.ObjectMeta{Name: "grants-" + name},
		Spec: apisv1alpha1.ClusterProviderConfigSpec{
			ProviderConfigSpec: apisv1alpha1.ProviderConfigSpec{NATSURL: "nats://nats.example:4222", Credentials: apisv1alpha1.NATSCredentials{Source: xpv2.CredentialsSourceNone}},
			Grants:             []apisv1alpha1.TenantGrant{{Namespaces: namespaces, BackupLocations: []string{name}}},
		},
	}))
	for _, n := range namespaces {
		require.NoError(t, e.Kube.Create(e.Ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n}}))
	}
	store, err := backupstore.Open(e.Ctx, backupstore.Location{Endpoint: s3.Endpoint, Region: s3.Region, Bucket: name, AccessKey: s3.AccessKey, SecretKey: s3.SecretKey})
	require.NoError(t, err)
	return store
}
