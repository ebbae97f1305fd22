package natswire_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/harness/natstest"
	"github.com/virtfleet/virtfleet/internal/natswire"
)

// hubJetStream starts a real nats-server and connects to it as the hub.
func hubJetStream(t *testing.T) jetstream.JetStream {
	t.Helper()
	hub, _, users := natstest.Identities(t)
	srv := natstest.New(t, users...)
	nc, _ := natstest.Connect(t, srv, hub)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	return js
}

// streamConfig is the configuration the server holds for bucket's stream.
func streamConfig(t *testing.T, js jetstream.JetStream, bucket string) jetstream.StreamConfig {
	t.Helper()
	s, err := js.Stream(context.Background(), "KV_"+bucket)
	require.NoError(t, err)
	info, err := s.Info(context.Background())
	require.NoError(t, err)
	return info.Config
}

// TestEnsureBucketsLimitsEveryBucket pins the byte limits on the server's
// streams, with the defaults and with a configuration that sets them.
func TestEnsureBucketsLimitsEveryBucket(t *testing.T) {
	cases := map[string]struct {
		cfg                             natswire.BucketConfig
		wantMaxBytes, wantNodesMaxBytes int64
		wantMaxValueSize                int32
	}{
		"Defaults": {
			wantMaxBytes: natswire.DefaultMaxBytes, wantNodesMaxBytes: natswire.DefaultNodesMaxBytes, wantMaxValueSize: natswire.DefaultMaxValueSize,
		},
		"Configured": {
			cfg:          natswire.BucketConfig{MaxBytes: 8 << 20, NodesMaxBytes: 2 << 20, MaxValueSize: 64 << 10},
			wantMaxBytes: 8 << 20, wantNodesMaxBytes: 2 << 20, wantMaxValueSize: 64 << 10,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			js := hubJetStream(t)
			require.NoError(t, natswire.EnsureBuckets(context.Background(), js, tc.cfg))
			for bucket, want := range map[string]int64{wire.BucketIntents: tc.wantMaxBytes, wire.BucketReports: tc.wantMaxBytes, wire.BucketNodes: tc.wantNodesMaxBytes} {
				c := streamConfig(t, js, bucket)
				assert.Equal(t, want, c.MaxBytes, "MaxBytes of %s", bucket)
				assert.Equal(t, tc.wantMaxValueSize, c.MaxMsgSize, "MaxValueSize of %s", bucket)
				assert.Equal(t, jetstream.DiscardNew, c.Discard, "a full %s bucket must refuse new values, not drop old ones", bucket)
				assert.Equal(t, bucket == wire.BucketNodes, c.AllowRollup, "roll-ups in %s: only the nodes bucket's expiry markers need them", bucket)
			}
		})
	}
}

// TestBucketRefusesWritesOverItsLimits shows the server enforcing the
// limits: a value over MaxValueSize and a value that would take the bucket
// over MaxBytes are refused, and what the bucket held stays.
func TestBucketRefusesWritesOverItsLimits(t *testing.T) {
	ctx := context.Background()
	js := hubJetStream(t)
	const maxBytes, maxValue = 64 << 10, 4 << 10
	require.NoError(t, natswire.EnsureBuckets(ctx, js, natswire.BucketConfig{MaxBytes: maxBytes, MaxValueSize: maxValue}))
	kv, err := js.KeyValue(ctx, wire.BucketIntents)
	require.NoError(t, err)

	_, err = kv.Put(ctx, "node1.too-big", bytes.Repeat([]byte("x"), maxValue+1))
	var apiErr *jetstream.APIError
	require.ErrorAs(t, err, &apiErr, "a value over MaxValueSize must be refused")
	assert.Equal(t, jetstream.JSErrCodeStreamMessageExceedsMaximum, apiErr.ErrorCode, apiErr.Description)

	// Fill the bucket with values under MaxValueSize until it refuses one;
	// it must do so before holding more than MaxBytes.
	value := bytes.Repeat([]byte("y"), maxValue/2)
	var stored []string
	for i := 0; ; i++ {
		key := fmt.Sprintf("node1.k%d", i)
		if _, err := kv.Put(ctx, key, value); err != nil {
			// nats-server's JSStreamStoreFailedF wraps ErrMaxBytes; nats.go
			// names no constant for it.
			require.ErrorContains(t, err, "maximum bytes exceeded")
			break
		}
		stored = append(stored, key)
		require.LessOrEqual(t, len(stored)*len(value), maxBytes, "the bucket took more than MaxBytes of values")
	}
	require.NotEmpty(t, stored)
	for _, key := range stored {
		e, err := kv.Get(ctx, key)
		require.NoError(t, err, "a full bucket must keep what it holds: %s", key)
		assert.Equal(t, value, e.Value())
	}
}

// TestEnsureBucketsLimitsExistingBuckets brings buckets made without limits
// and with roll-ups allowed (as before the limits existed) to the configured
// ones at the next start,
// keeping their values, the way it brings them to the configured replicas.
func TestEnsureBucketsLimitsExistingBuckets(t *testing.T) {
	ctx := context.Background()
	js := hubJetStream(t)
	for _, c := range natswire.KeyValueConfigs(natswire.BucketConfig{}) {
		c.MaxBytes, c.MaxValueSize = 0, 0
		_, err := js.CreateKeyValue(ctx, c)
		require.NoError(t, err)
		require.Equal(t, int64(-1), streamConfig(t, js, c.Bucket).MaxBytes, "the old bucket %s is unlimited", c.Bucket)
	}
	kv, err := js.KeyValue(ctx, wire.BucketIntents)
	require.NoError(t, err)
	_, err = kv.Put(ctx, "node1.vm", []byte("intent"))
	require.NoError(t, err)

	require.NoError(t, natswire.EnsureBuckets(ctx, js, natswire.BucketConfig{}))
	for _, bucket := range []string{wire.BucketIntents, wire.BucketReports, wire.BucketNodes} {
		c := streamConfig(t, js, bucket)
		assert.Positive(t, c.MaxBytes, "MaxBytes of %s", bucket)
		assert.Equal(t, natswire.DefaultMaxValueSize, c.MaxMsgSize, "MaxValueSize of %s", bucket)
		assert.Equal(t, bucket == wire.BucketNodes, c.AllowRollup, "roll-ups in %s", bucket)
	}
	e, err := kv.Get(ctx, "node1.vm")
	require.NoError(t, err)
	assert.Equal(t, []byte("intent"), e.Value())
}
