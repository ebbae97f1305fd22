package stack

import (
	"context"
	"path/filepath"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/harness/s3test"
)

// The stack's backup location, when Options.ObjectStore starts one: a
// bucket of a SeaweedFS server under Dir/s3, declared as the cluster-scoped
// BackupLocation LocationName with its credentials in the Secret
// LocationSecretName of the system namespace. DefaultGrants let the
// namespaces they name use it.
const (
	LocationName       = "local"
	LocationBucket     = "backups"
	LocationSecretName = "backup-location-local"
)

// startObjectStore starts the S3 server and declares it as the location.
func (s *Stack) startObjectStore(ctx context.Context) error {
	srv, err := s3test.Start(ctx, filepath.Join(s.opts.Dir, "s3"), s.opts.Progress)
	if err != nil {
		return err
	}
	s.ObjectStore = srv
	if err := srv.MakeBucket(ctx, LocationBucket); err != nil {
		return err
	}
	kube := s.ControlPlane.Client
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: SystemNamespace, Name: LocationSecretName}}
	if _, err := controllerutil.CreateOrUpdate(ctx, kube, secret, func() error {
		secret.Data = map[string][]byte{v1alpha1.BackupAccessKeyID: []byte(srv.AccessKey), v1alpha1.BackupSecretAccessKey: []byte(srv.SecretKey)}
		return nil
	}); err != nil {
		return errors.Wrap(err, "cannot store the backup location's credentials")
	}
	l := &v1alpha1.BackupLocation{ObjectMeta: metav1.ObjectMeta{Name: LocationName}}
	_, err = controllerutil.CreateOrUpdate(ctx, kube, l, func() error {
		l.Spec = v1alpha1.BackupLocationSpec{
			Endpoint: srv.Endpoint, Insecure: true, Region: srv.Region, Bucket: LocationBucket,
			CredentialsSecretRef: xpv2.SecretReference{Namespace: SystemNamespace, Name: LocationSecretName},
		}
		return nil
	})
	if err != nil {
		return errors.Wrap(err, "cannot declare the backup location")
	}
	logf(s.opts.Progress, "backups", "BackupLocation %s: bucket %s of SeaweedFS at %s", LocationName, LocationBucket, srv.Endpoint)
	return nil
}
