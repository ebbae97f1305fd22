package natswire

import (
	"errors"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
)

// Reasons a watcher refuses a value it read from a bucket.
const (
	ReasonDecode   = "decode"
	ReasonVersion  = "protocol-version"
	ReasonKey      = "key"
	ReasonMismatch = "key-content-mismatch"
)

// Reasons are every reason a watcher refuses a value for.
var Reasons = []string{ReasonDecode, ReasonVersion, ReasonKey, ReasonMismatch}

// Rejections counts refused values by reason. The zero value is ready to use
// and safe for concurrent use.
type Rejections struct {
	// Counter, when set, counts each rejection too, labelled with its
	// reason: the hub and the agent serve theirs as metrics.
	Counter *prometheus.CounterVec

	mu     sync.Mutex
	counts map[string]uint64
}

// Add counts one rejection for err and returns its reason.
func (r *Rejections) Add(err error) string {
	reason := Reason(err)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.counts == nil {
		r.counts = map[string]uint64{}
	}
	r.counts[reason]++
	if r.Counter != nil {
		r.Counter.WithLabelValues(reason).Inc()
	}
	return reason
}

// Count of rejections for reason.
func (r *Rejections) Count(reason string) uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.counts[reason]
}

// MismatchError is a value stored under a key that is not its own.
type MismatchError = wire.MismatchError

// Reason classifies an error from decoding a bucket value.
func Reason(err error) string {
	var (
		ve *wire.VersionError
		ke *wire.KeyError
		me *MismatchError
	)
	switch {
	case errors.As(err, &ve):
		return ReasonVersion
	case errors.As(err, &me):
		return ReasonMismatch
	case errors.As(err, &ke):
		return ReasonKey
	default:
		return ReasonDecode
	}
}

// DecodeValue decodes the value of a key that was not deleted, and refuses
// one whose identity (what id says of it) is not want, the one its key
// implies, with a *MismatchError: the server only lets a node's agent write
// under its prefix, so a mismatch is a bug or a forgery and must not act.
func DecodeValue[V any](key, want string, deleted bool, value []byte, decode func([]byte) (V, error), id func(V) string) (V, error) {
	var v V
	if deleted {
		return v, nil
	}
	v, err := decode(value)
	if err != nil {
		return v, err
	}
	if got := id(v); got != want {
		return v, &MismatchError{Key: key, Want: want, Got: got}
	}
	return v, nil
}
