package backupstore

import wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"

// LocationOf is the Location a backup intent names.
func LocationOf(l wire.BackupLocation) Location {
	return Location{
		Endpoint: l.Endpoint, Secure: !l.Insecure, Region: l.Region, Bucket: l.Bucket, Prefix: l.Prefix,
		AccessKey: l.Credentials.AccessKeyID, SecretKey: l.Credentials.SecretAccessKey, Key: l.Credentials.EncryptionKey,
	}
}
