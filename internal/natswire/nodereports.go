package natswire

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/nats-io/nats.go/jetstream"

	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
)

// Each node's reports land in a stream of the node's own, bounded in keys
// and bytes, and the reports bucket's stream holds no subject of its own:
// it sources every node's stream. A node's agent may publish to its own
// report keys only (AgentPermissions), but JetStream bounds a stream, not
// the keys under one prefix of it: in one shared stream a stolen node
// credential could write keys until the stream's limit refused every other
// node's reports. Its own stream refuses its keys past its bound, with an
// error the agent sees, while the other nodes' streams take theirs; the
// bucket the hub watches holds at most every node's bound.
//
//   - DefaultNodeReportKeys is 8192 keys: a node's guests, their volumes,
//     images and snapshots each hold one, and a deleted key's marker one
//     until it expires (ReportDeletedTTL). A dense node of 1000 guests with
//     a volume each holds about 2000.
//   - DefaultNodeReportBytes is 8 MiB, room for those keys at their usual
//     size of well under a KiB. JetStream reserves it on each server holding
//     the node's stream, so a fleet of N nodes reserves N times it.
const (
	DefaultNodeReportKeys  int64 = 8192
	DefaultNodeReportBytes int64 = 8 << 20
)

// ReportDeletedTTL is how long the marker of a deleted report lives. A
// marker holds one of its node's keys, so without an expiry a node would
// reach its bound after that many guests came and went. The hub's watch
// sees a marker at once; one that expired unseen (a hub down meanwhile)
// leaves the key absent, which reads the same.
const ReportDeletedTTL = time.Hour

// HeaderTTL is JetStream's per-message TTL header (streams with
// AllowMsgTTL).
const HeaderTTL = "Nats-TTL"

// maxStreamName is nats-server's limit on a stream's name.
const maxStreamName = 255

// NodeReportsStream is the stream that holds the reports of the node whose
// key token (wire.NodeToken) is token. A token too long for a stream name
// is hashed.
func NodeReportsStream(token string) string {
	name := "REPORTS_" + token
	if len(name) <= maxStreamName {
		return name
	}
	sum := sha256.Sum256([]byte(token))
	return "REPORTS_" + hex.EncodeToString(sum[:])
}

// NodeReportsStreamOfKey is the stream that holds the report key, a key of
// the reports bucket: the stream of the node its first token names.
func NodeReportsStreamOfKey(key string) (string, error) {
	token, _, ok := strings.Cut(key, ".")
	if !ok {
		return "", &wire.KeyError{What: "report key", Value: key, Reason: "has no node prefix"}
	}
	if err := wire.ValidateToken("node", token); err != nil {
		return "", err
	}
	return NodeReportsStream(token), nil
}

// reportsConfig is the reports bucket's stream: no subject of its own, the
// nodes' streams as its sources, one value per key as a KV bucket has. It
// has no byte limit: its sources bound it, and a limit reached would stop
// every node's reports at once, which is what the nodes' own streams are
// there to prevent.
func reportsConfig(cfg BucketConfig, sources []*jetstream.StreamSource) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:              wire.Stream(wire.BucketReports),
		Description:       "agent → hub: observed state per <node>.<uid>, from each node's own stream",
		Sources:           sources,
		Storage:           jetstream.FileStorage,
		Replicas:          cmp.Or(cfg.Replicas, 1),
		MaxMsgsPerSubject: 1,
		MaxMsgSize:        cmp.Or(cfg.MaxValueSize, DefaultMaxValueSize),
		MaxBytes:          -1,
		MaxMsgs:           -1,
		Discard:           jetstream.DiscardNew,
		AllowDirect:       true,
		// As a KV bucket: no message is removed by its sequence (an update
		// cannot take that back from a bucket made as one).
		DenyDelete: true,
		// The deleted reports' markers carry their TTL from the node's
		// stream.
		AllowMsgTTL: true,
	}
}

// nodeReportsConfig is the stream of the node whose token is token. At its
// bound it refuses new keys but takes new values of the keys it holds
// (discard new with one value per subject), so the node keeps reporting on
// what it reported before.
func nodeReportsConfig(cfg BucketConfig, token string) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:              NodeReportsStream(token),
		Description:       "agent → hub: observed state of node " + token + ", sourced into " + wire.Stream(wire.BucketReports),
		Subjects:          []string{wire.Subject(wire.BucketReports, token+".>")},
		Storage:           jetstream.FileStorage,
		Replicas:          cmp.Or(cfg.Replicas, 1),
		MaxMsgsPerSubject: 1,
		MaxMsgs:           cmp.Or(cfg.NodeReportKeys, DefaultNodeReportKeys),
		MaxBytes:          cmp.Or(cfg.NodeReportBytes, DefaultNodeReportBytes),
		MaxMsgSize:        cmp.Or(cfg.MaxValueSize, DefaultMaxValueSize),
		Discard:           jetstream.DiscardNew,
		AllowDirect:       true,
		DenyDelete:        true,
		AllowMsgTTL:       true,
	}
}

// ensureReports brings the reports bucket's stream to cfg, keeping the
// nodes it sources and bringing their streams to cfg too (a changed bound
// applies at the hub's next start). A bucket made before the nodes' own
// streams held every subject; it gives them up first, so that the nodes'
// streams can take them.
func ensureReports(ctx context.Context, js jetstream.JetStream, cfg BucketConfig) error {
	var sources []*jetstream.StreamSource
	s, err := js.Stream(ctx, wire.Stream(wire.BucketReports))
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
	case err != nil:
		return errors.Wrapf(err, "cannot read bucket %s", wire.BucketReports)
	default:
		sources = s.CachedInfo().Config.Sources
	}
	if _, err := js.CreateOrUpdateStream(ctx, reportsConfig(cfg, sources)); err != nil {
		return errors.Wrapf(err, "cannot create bucket %s", wire.BucketReports)
	}
	// The nodes' streams are read in pages, and only one whose bound
	// changed is written: a hub starting over a thousand nodes would
	// otherwise send a thousand updates, one after another, before it
	// could connect.
	have := map[string]jetstream.StreamConfig{}
	// A node's stream lost meanwhile is not made here under the bucket's
	// stale source of it, which would never source it: the node's next
	// heartbeat makes both afresh (EnsureNodeReports).
	taken, err := checkNodeReports(ctx, js, func() (map[string]bool, error) {
		exist := map[string]bool{}
		infos := js.ListStreams(ctx, jetstream.WithStreamListSubject(wire.Subject(wire.BucketReports, ">")))
		for info := range infos.Info() {
			have[info.Config.Name], exist[info.Config.Name] = info.Config, true
		}
		return exist, errors.Wrap(infos.Err(), "cannot list the nodes' reports streams")
	})
	if err != nil {
		return err
	}
	for _, src := range sources {
		token, ok := strings.CutPrefix(src.Name, "REPORTS_")
		if !ok || !taken[src.Name] {
			continue
		}
		want := nodeReportsConfig(cfg, token)
		if !differs(have[src.Name], want) {
			continue
		}
		if _, err := js.UpdateStream(ctx, want); err != nil {
			return errors.Wrapf(err, "cannot bound the reports of %s", token)
		}
	}
	return nil
}

// differs says whether a stream configured as have lacks any setting want
// makes. Only want's non-zero fields are compared: the server fills those
// left zero with its defaults, which do not differ from what want means.
func differs(have, want jetstream.StreamConfig) bool {
	h, w := reflect.ValueOf(have), reflect.ValueOf(want)
	for i := range w.NumField() {
		if f := w.Field(i); !f.IsZero() && !reflect.DeepEqual(f.Interface(), h.Field(i).Interface()) {
			return true
		}
	}
	return false
}

// EnsureNodeReports creates node's own reports stream and has the reports
// bucket source it; until then the node's reports are refused (no stream
// takes them). It is safe to call again. Hub replicas adding nodes at once
// could each write the bucket's sources without the other's, so it reads
// them back until its node is among them.
func EnsureNodeReports(ctx context.Context, js jetstream.JetStream, cfg BucketConfig, node string) error {
	if err := wire.ValidateNodeName(node); err != nil {
		return err
	}
	own := nodeReportsConfig(cfg, wire.NodeToken(node))
	if _, err := js.CreateOrUpdateStream(ctx, own); err != nil {
		return errors.Wrapf(err, "cannot create the reports stream of node %s", node)
	}
	for range 5 {
		s, err := js.Stream(ctx, wire.Stream(wire.BucketReports))
		if err != nil {
			return errors.Wrapf(err, "cannot read bucket %s", wire.BucketReports)
		}
		c := s.CachedInfo().Config
		if slices.ContainsFunc(c.Sources, func(src *jetstream.StreamSource) bool { return src.Name == own.Name }) {
			return nil
		}
		// A bucket made with no source yet was given its own name as its
		// subject; sources take its place.
		c.Subjects, c.Sources = nil, append(c.Sources, &jetstream.StreamSource{Name: own.Name})
		if _, err := js.UpdateStream(ctx, c); err != nil {
			return errors.Wrapf(err, "cannot add the reports of node %s to bucket %s", node, wire.BucketReports)
		}
	}
	return errors.Errorf("cannot add the reports of node %s to bucket %s: its sources keep changing", node, wire.BucketReports)
}

// DropNodeReports deletes node's own reports stream and has the reports
// bucket stop sourcing it: what a node removed for good leaves behind, each
// stream holding its bound of the JetStream store. The node's keys in the
// bucket stay as they are: delete them first (their markers reach the
// bucket through the stream). A node heard from again gets its stream
// afresh (EnsureNodeReports).
func DropNodeReports(ctx context.Context, js jetstream.JetStream, node string) error {
	if err := wire.ValidateNodeName(node); err != nil {
		return err
	}
	err := js.DeleteStream(ctx, NodeReportsStream(wire.NodeToken(node)))
	if err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return errors.Wrapf(err, "cannot delete the reports stream of node %s", node)
	}
	_, err = CheckNodeReports(ctx, js)
	return err
}

// CheckNodeReports returns the nodes' reports streams, by name, that exist
// and that the reports bucket sources: those whose node's reports are taken
// and reach the bucket. It costs a read of the bucket's stream and a
// listing of the streams' names however many nodes there are, so a hub can
// check what it believes of every node at once.
//
// The bucket stops sourcing the streams that are gone: JetStream does not
// take a source up again from a stream made anew under its name, so the
// node's reports would reach that stream and never the bucket.
// EnsureNodeReports then makes the stream and adds its source afresh.
func CheckNodeReports(ctx context.Context, js jetstream.JetStream) (map[string]bool, error) {
	return checkNodeReports(ctx, js, func() (map[string]bool, error) {
		exist := map[string]bool{}
		names := js.StreamNames(ctx, jetstream.WithStreamListSubject(wire.Subject(wire.BucketReports, ">")))
		for name := range names.Name() {
			exist[name] = true
		}
		return exist, errors.Wrap(names.Err(), "cannot list the nodes' reports streams")
	})
}

// checkNodeReports is CheckNodeReports with list saying, by name, which
// nodes' reports streams exist. It is called after the bucket's sources
// are read: a node's stream is made before the bucket sources it
// (EnsureNodeReports), so a source read first names a stream the list
// holds, unless it is gone.
func checkNodeReports(ctx context.Context, js jetstream.JetStream, list func() (map[string]bool, error)) (map[string]bool, error) {
	s, err := js.Stream(ctx, wire.Stream(wire.BucketReports))
	if err != nil {
		return nil, errors.Wrapf(err, "cannot read bucket %s", wire.BucketReports)
	}
	exist, err := list()
	if err != nil {
		return nil, err
	}
	c := s.CachedInfo().Config
	taken := map[string]bool{}
	gone := false
	for _, src := range c.Sources {
		taken[src.Name] = exist[src.Name]
		gone = gone || !exist[src.Name]
	}
	if !gone {
		return taken, nil
	}
	c.Sources = slices.DeleteFunc(c.Sources, func(src *jetstream.StreamSource) bool { return !exist[src.Name] })
	if _, err := js.UpdateStream(ctx, c); err != nil {
		return nil, errors.Wrapf(err, "cannot stop bucket %s sourcing lost streams", wire.BucketReports)
	}
	return taken, nil
}
