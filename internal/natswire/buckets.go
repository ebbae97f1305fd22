// Package natswire is the wire protocol's NATS binding, the one piece of
// production code the hub and the agent share besides apis/wire: the
// JetStream key-value buckets and how they are created (buckets.go), the
// counting of rejected wire messages (rejections.go), and the permission model
// with the nkey identities that enforce it (auth.go).
//
// The hub creates the buckets at start; tests of either side create them the
// same way, so no test runs against a bucket shaped differently from
// production's.
package natswire

import (
	"context"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/nats-io/nats.go/jetstream"

	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
)

// Defaults from the design: an agent refreshes its heartbeat every 2 s, and a
// node whose heartbeat is 10 s old is purged from the nodes bucket, which is
// how the hub learns it is lost.
const (
	DefaultNodeTTL           = 10 * time.Second
	DefaultHeartbeatInterval = 2 * time.Second
)

// BucketConfig shapes the buckets.
type BucketConfig struct {
	// Replicas of each bucket; 0 means 1.
	Replicas int
	// NodeTTL is how long a heartbeat lives unrefreshed; 0 means
	// DefaultNodeTTL. Tests shorten it to observe expiry quickly.
	NodeTTL time.Duration
}

// KeyValueConfigs are the bucket configurations for cfg.
func KeyValueConfigs(cfg BucketConfig) []jetstream.KeyValueConfig {
	replicas := cfg.Replicas
	if replicas == 0 {
		replicas = 1
	}
	ttl := cfg.NodeTTL
	if ttl == 0 {
		ttl = DefaultNodeTTL
	}
	return []jetstream.KeyValueConfig{
		{Bucket: wire.BucketIntents, Description: "hub → agent: desired state per <node>.<uid>", Storage: jetstream.FileStorage, Replicas: replicas},
		{Bucket: wire.BucketReports, Description: "agent → hub: observed state per <node>.<uid>", Storage: jetstream.FileStorage, Replicas: replicas},
		{
			Bucket: wire.BucketNodes, Description: "agent heartbeats per <node>", Storage: jetstream.FileStorage, Replicas: replicas,
			// Per-key TTLs are fixed at Create and a Put cannot refresh them,
			// so expiry is the bucket's max age; the limit marker turns the
			// expiry into a purge that watchers see.
			TTL: ttl, LimitMarkerTTL: ttl,
		},
	}
}

// EnsureBuckets creates the buckets, or brings existing ones to cfg. It is safe to
// call on every start.
func EnsureBuckets(ctx context.Context, js jetstream.JetStream, cfg BucketConfig) error {
	for _, c := range KeyValueConfigs(cfg) {
		if _, err := js.CreateOrUpdateKeyValue(ctx, c); err != nil {
			return errors.Wrapf(err, "cannot create bucket %s", c.Bucket)
		}
	}
	return nil
}
