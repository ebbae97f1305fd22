// Package natswire is the wire protocol's NATS binding, the one piece of
// production code the hub and the agent share besides apis/wire: the
// JetStream key-value buckets and how they are created (buckets.go), each
// node's own bounded reports stream, which the reports bucket sources
// (nodereports.go), the counting of rejected wire messages (rejections.go),
// and the permission model with the nkey identities that enforce it
// (auth.go).
//
// The hub creates the buckets at start; tests of either side create them the
// same way, so no test runs against a bucket shaped differently from
// production's.
package natswire

import (
	"cmp"
	"context"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/nats-io/nats.go/jetstream"

	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
)

// Defaults from the design: an agent refreshes its heartbeat every 2 s, and a
// node that has stored no heartbeat for 10 s is lost: its heartbeat expires
// from the nodes bucket, and the hub, finding no newer one there, takes the
// node for lost.
const (
	DefaultNodeTTL           = 10 * time.Second
	DefaultHeartbeatInterval = 2 * time.Second
)

// Byte limits of the buckets. Without them one tenant's objects (a VM's
// intent carries its userData and publicKey) could fill the NATS server's
// store, and with it every other bucket: heartbeats would stop and every
// node would look lost. A bucket at its limit refuses new values (KV buckets
// discard new, never old), so the fleet's existing state stays intact and
// only the writes over the limit fail, with an error the hub reports on the
// resource. The reports are bounded per node instead (nodereports.go).
//
//   - DefaultMaxValueSize is 1 MiB, nats-server's default max_payload. The
//     largest value the wire protocol makes is an intent whose strings are
//     all at their schema bounds (64Ki characters of userData, 16Ki of
//     publicKey, 16 disks with 2048-character image URLs): about 700 KiB
//     even if JSON escaped every character to six bytes. So no value the
//     API accepts is refused, and the limit holds also on a server
//     configured with a larger max_payload.
//   - DefaultMaxBytes, 256 MiB, bounds the intents bucket: a VM's intent is
//     a few KiB with ordinary userData, so it holds tens of thousands of
//     VMs with their volumes and images.
//   - DefaultNodesMaxBytes, 64 MiB, bounds the nodes bucket, one heartbeat
//     of under a few KiB per node.
//
// JetStream reserves a stream's MaxBytes on each server that holds a replica
// and refuses a stream that does not fit its max_file_store; the two
// together reserve 320 MiB, and each node's reports DefaultNodeReportBytes
// more, which fits the 1 GiB store of cluster/deploy/nats with room for
// dozens of nodes.
const (
	DefaultMaxValueSize  int32 = 1 << 20
	DefaultMaxBytes      int64 = 256 << 20
	DefaultNodesMaxBytes int64 = 64 << 20
)

// DefaultIntentConsumers bounds the consumers of the intents bucket. Every
// agent watches its own intents through one, so nats-server's default of
// 1,000 a stream (default_max_consumers) refuses the watch of a fleet's
// thousandth node ("maximum consumers limit reached"), and those nodes'
// retries then load the server until it takes no heartbeat either. A bound
// stays, for an agent may create consumers on the stream: a sixteenth of
// it would serve a thousand nodes.
const DefaultIntentConsumers = 16384

// BucketConfig shapes the buckets.
type BucketConfig struct {
	// Replicas of each bucket; 0 means 1.
	Replicas int
	// NodeTTL is how long a heartbeat lives unrefreshed; 0 means
	// DefaultNodeTTL. Tests shorten it to observe expiry quickly.
	NodeTTL time.Duration
	// MaxBytes bounds the storage of the intents bucket; 0 means
	// DefaultMaxBytes.
	MaxBytes int64
	// NodeReportKeys and NodeReportBytes bound the reports of each node
	// (EnsureNodeReports); 0 means DefaultNodeReportKeys and
	// DefaultNodeReportBytes.
	NodeReportKeys, NodeReportBytes int64
	// NodesMaxBytes bounds the storage of the nodes bucket; 0 means
	// DefaultNodesMaxBytes.
	NodesMaxBytes int64
	// MaxValueSize bounds each value in every bucket; 0 means
	// DefaultMaxValueSize.
	MaxValueSize int32
	// IntentConsumers bounds the consumers of the intents bucket; 0 means
	// DefaultIntentConsumers.
	IntentConsumers int
}

// KeyValueConfigs are the configurations of the buckets made as KV buckets
// for cfg: all but the reports bucket, whose stream sources the nodes'
// (reportsConfig).
func KeyValueConfigs(cfg BucketConfig) []jetstream.KeyValueConfig {
	replicas := cfg.Replicas
	if replicas == 0 {
		replicas = 1
	}
	ttl := cfg.NodeTTL
	if ttl == 0 {
		ttl = DefaultNodeTTL
	}
	maxBytes := cmp.Or(cfg.MaxBytes, DefaultMaxBytes)
	nodesMaxBytes := cmp.Or(cfg.NodesMaxBytes, DefaultNodesMaxBytes)
	maxValue := cmp.Or(cfg.MaxValueSize, DefaultMaxValueSize)
	return []jetstream.KeyValueConfig{
		{
			Bucket: wire.BucketIntents, Description: "hub → agent: desired state per <node>.<uid>", Storage: jetstream.FileStorage, Replicas: replicas,
			MaxBytes: maxBytes, MaxValueSize: maxValue,
		},
		{
			Bucket: wire.BucketNodes, Description: "agent heartbeats per <node>", Storage: jetstream.FileStorage, Replicas: replicas,
			MaxBytes: nodesMaxBytes, MaxValueSize: maxValue,
			// Per-key TTLs are fixed at Create and a Put cannot refresh them,
			// so expiry is the bucket's max age. It leaves no marker: markers
			// need roll-ups, and a roll-up a node may send (see
			// forbidRollups) would purge every node's heartbeat. The hub
			// asks the bucket once a node's heartbeat is a TTL old instead
			// (hub/internal/bus).
			TTL: ttl,
		},
	}
}

// EnsureBuckets creates the buckets, or brings existing ones to cfg (their
// replicas and limits: a bucket made before the limits existed gets them at
// the hub's next start). It is safe to call on every start. Lowering a limit
// below what a bucket holds deletes nothing: KV buckets discard new values,
// so only later writes are refused until it shrinks.
//
// It also forbids roll-ups in the KV buckets and bounds the intents
// bucket's consumers (see forbidRollups), which a KV bucket's configuration
// cannot say; the reports' streams never allow roll-ups.
func EnsureBuckets(ctx context.Context, js jetstream.JetStream, cfg BucketConfig) error {
	for _, c := range KeyValueConfigs(cfg) {
		if err := ensureKeyValue(ctx, js, c); err != nil {
			return err
		}
		consumers := 0
		if c.Bucket == wire.BucketIntents {
			consumers = cmp.Or(cfg.IntentConsumers, DefaultIntentConsumers)
		}
		if err := forbidRollups(ctx, js, c.Bucket, consumers); err != nil {
			return err
		}
	}
	return ensureReports(ctx, js, cfg)
}

// ensureKeyValue creates the bucket c or brings it to c. A nodes bucket
// made when expiry markers told the hub of a lost node allows per-message
// TTLs, which nats-server never lets an update turn off, and an update
// through the KV API would: its stream is brought to c directly, its
// markers, and the roll-ups they need, turned off.
func ensureKeyValue(ctx context.Context, js jetstream.JetStream, c jetstream.KeyValueConfig) error {
	s, err := js.Stream(ctx, wire.Stream(c.Bucket))
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
	case err != nil:
		return errors.Wrapf(err, "cannot read bucket %s", c.Bucket)
	case s.CachedInfo().Config.AllowMsgTTL:
		sc := s.CachedInfo().Config
		sc.Description, sc.Replicas, sc.MaxAge, sc.MaxBytes, sc.MaxMsgSize = c.Description, c.Replicas, c.TTL, c.MaxBytes, c.MaxValueSize
		sc.SubjectDeleteMarkerTTL, sc.AllowRollup = 0, false
		if _, err := js.UpdateStream(ctx, sc); err != nil {
			return errors.Wrapf(err, "cannot update bucket %s", c.Bucket)
		}
		return nil
	}
	if _, err := js.CreateOrUpdateKeyValue(ctx, c); err != nil {
		return errors.Wrapf(err, "cannot create bucket %s", c.Bucket)
	}
	return nil
}

// forbidRollups sets what a KV bucket's stream needs that its configuration
// cannot say: no roll-ups, and at most maxConsumers consumers when it is not
// 0 (see DefaultIntentConsumers). nats.go makes every bucket allow messages
// with a Nats-Rollup header, for its Purge, which virtfleet never uses; but
// the header is no part of a subject, so no permission can keep it from a
// writer, and "Nats-Rollup: all" on one key would remove every other key:
// a node, which may write its own heartbeat, would purge every other
// node's (the reports' streams, which nodes write, never allow them
// either).
func forbidRollups(ctx context.Context, js jetstream.JetStream, bucket string, maxConsumers int) error {
	s, err := js.Stream(ctx, wire.Stream(bucket))
	if err != nil {
		return errors.Wrapf(err, "cannot read bucket %s", bucket)
	}
	c := s.CachedInfo().Config
	if !c.AllowRollup && (maxConsumers == 0 || c.MaxConsumers == maxConsumers) {
		return nil
	}
	c.AllowRollup = false
	if maxConsumers != 0 {
		c.MaxConsumers = maxConsumers
	}
	if _, err := js.UpdateStream(ctx, c); err != nil {
		return errors.Wrapf(err, "cannot forbid roll-ups in bucket %s", bucket)
	}
	return nil
}
