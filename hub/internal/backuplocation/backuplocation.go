// Package backuplocation reads BackupLocations for the hub: the location
// and the credentials its Secret holds, which only the hub reads and only
// the node that takes or reads a backup is handed.
package backuplocation

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/backupstore"
)

// Resolve is the BackupLocation name with its credentials, or why it
// cannot be used yet: it or its Secret is missing, or the Secret lacks a
// key. Only the hub reads the Secret, and only the node that takes or
// restores a backup is handed what it holds.
func Resolve(ctx context.Context, kube client.Reader, name string) (wire.BackupLocation, string, error) {
	l := &v1alpha1.BackupLocation{}
	err := kube.Get(ctx, types.NamespacedName{Name: name}, l)
	switch {
	case kerrors.IsNotFound(err):
		return wire.BackupLocation{}, fmt.Sprintf("BackupLocation %s does not exist", name), nil
	case err != nil:
		return wire.BackupLocation{}, "", errors.Wrapf(err, "cannot get BackupLocation %s", name)
	}
	ref := l.Spec.CredentialsSecretRef
	s := &corev1.Secret{}
	err = kube.Get(ctx, types.NamespacedName{Namespace: ref.Namespace, Name: ref.Name}, s)
	switch {
	case kerrors.IsNotFound(err):
		return wire.BackupLocation{}, fmt.Sprintf("Secret %s/%s of BackupLocation %s does not exist", ref.Namespace, ref.Name, name), nil
	case err != nil:
		return wire.BackupLocation{}, "", errors.Wrapf(err, "cannot get the Secret of BackupLocation %s", name)
	}
	c := wire.BackupCredentials{
		AccessKeyID: string(s.Data[v1alpha1.BackupAccessKeyID]), SecretAccessKey: string(s.Data[v1alpha1.BackupSecretAccessKey]),
		EncryptionKey: s.Data[v1alpha1.BackupEncryptionKey],
	}
	switch {
	case c.AccessKeyID == "" || c.SecretAccessKey == "":
		return wire.BackupLocation{}, fmt.Sprintf("Secret %s/%s of BackupLocation %s needs the keys %s and %s", ref.Namespace, ref.Name, name, v1alpha1.BackupAccessKeyID, v1alpha1.BackupSecretAccessKey), nil
	case len(c.EncryptionKey) != 0 && len(c.EncryptionKey) != backupstore.KeySize:
		return wire.BackupLocation{}, fmt.Sprintf("the %s of Secret %s/%s of BackupLocation %s must be %d bytes, not %d", v1alpha1.BackupEncryptionKey, ref.Namespace, ref.Name, name, backupstore.KeySize, len(c.EncryptionKey)), nil
	}
	return wire.BackupLocation{
		Endpoint: l.Spec.Endpoint, Insecure: l.Spec.Insecure, Region: l.Spec.Region,
		Bucket: l.Spec.Bucket, Prefix: l.Spec.Prefix, Credentials: c,
	}, "", nil
}
