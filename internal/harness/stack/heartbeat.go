package stack

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
)

// heartbeatWait bounds awaitHeartbeats.
const heartbeatWait = 3 * time.Minute

// awaitHeartbeats waits until every node's agent has put a heartbeat. Only
// then does the hub see every node, so that a workload created right after
// the start is spread over all of them, not over those whose agents came up
// first. Nothing here creates the buckets: the hub does, as it connects to
// the default ClusterProviderConfig's NATS at its start, as on a fresh
// install. A hub starting beside the whole suite on a loaded machine
// may take more than a minute to get there (CRDs established, caches
// synced, its connection made), so the wait is heartbeatWait.
func (s *Stack) awaitHeartbeats(ctx context.Context) error {
	opts, err := s.hubID.ConnectOptions()
	if err != nil {
		return err
	}
	nc, err := nats.Connect(s.NATSURL(), opts...)
	if err != nil {
		return errors.Wrap(err, "cannot connect to NATS as the hub")
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return errors.Wrap(err, "cannot use JetStream")
	}
	ctx, cancel := context.WithTimeout(ctx, heartbeatWait)
	defer cancel()
	var (
		last    error  // why the last look was not enough
		missing string // the node without a heartbeat in the last look
	)
	err = wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		// A NATS cluster still electing its meta leader answers no request:
		// each look gets a few seconds, not the whole minute.
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		kv, err := js.KeyValue(ctx, wire.BucketNodes)
		if err != nil {
			last = errors.Wrap(err, "no heartbeat bucket")
			return false, nil
		}
		for _, n := range s.opts.Nodes {
			key, err := wire.NodeKey(n)
			if err != nil {
				return false, err
			}
			if _, err := kv.Get(ctx, key); err != nil {
				if gone := s.serverOf(n).gone(); gone != nil {
					// No heartbeat will come: say so now, not in a minute.
					return false, gone
				}
				last = errors.Wrapf(err, "no heartbeat of %s", n)
				missing = n
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		err = errors.Wrapf(errors.Join(err, last), "not every agent put a heartbeat within %s", heartbeatWait)
		if missing != "" {
			err = errors.Errorf("%v\n%s", err, s.describeNode(missing))
		}
		return err
	}
	return nil
}

// serverOf is the process that serves node: its agent, or the simulated
// nodes' process.
func (s *Stack) serverOf(node string) *component {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.simulated != nil {
		return s.simulated
	}
	return s.agents[node]
}

// describeNode is what the logs of node's agent and libvirtd end with, for
// an error that node's agent cannot be heard: the test's logs are gone
// with the machine that ran it, its output is not.
func (s *Stack) describeNode(node string) string {
	var b strings.Builder
	if c := s.serverOf(node); c != nil {
		fmt.Fprintf(&b, "the end of the log of %s:\n%s\n", c.name, tail(c.log.Name(), 20))
	}
	if n := s.Nodes[node]; n != nil {
		fmt.Fprintf(&b, "the end of the log of %s's libvirtd (%s):\n%s\n", node, n.State(), tail(n.LogPath(), 10))
	}
	return b.String()
}

// Heartbeat is node's last heartbeat, read as the hub reads it.
func (s *Stack) Heartbeat(ctx context.Context, node string) (wire.NodeHeartbeat, error) {
	opts, err := s.hubID.ConnectOptions()
	if err != nil {
		return wire.NodeHeartbeat{}, err
	}
	nc, err := nats.Connect(s.NATSURL(), opts...)
	if err != nil {
		return wire.NodeHeartbeat{}, errors.Wrap(err, "cannot connect to NATS as the hub")
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return wire.NodeHeartbeat{}, errors.Wrap(err, "cannot use JetStream")
	}
	kv, err := js.KeyValue(ctx, wire.BucketNodes)
	if err != nil {
		return wire.NodeHeartbeat{}, errors.Wrap(err, "no heartbeat bucket")
	}
	e, err := kv.Get(ctx, node)
	if err != nil {
		return wire.NodeHeartbeat{}, errors.Wrapf(err, "no heartbeat of %s", node)
	}
	return wire.DecodeNodeHeartbeat(e.Value())
}
