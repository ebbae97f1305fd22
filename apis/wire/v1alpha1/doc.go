// Package v1alpha1 is the wire protocol between the hub and the agents:
// intents, reports and node heartbeats carried in NATS JetStream key-value
// buckets. It imports only the standard library, so any NATS client in any
// language can speak it from this package's documentation alone.
package v1alpha1
