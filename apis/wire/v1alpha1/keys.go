package v1alpha1

import (
	"fmt"
	"strings"
)

// Bucket names. The JetStream stream behind bucket B is "KV_B" and a key K is
// stored on subject "$KV.B.K"; permissions are written against those subjects.
const (
	BucketIntents = "intents"
	BucketReports = "reports"
	BucketNodes   = "nodes"
)

// maxTokenLen bounds a key token: the token of the longest node name, every
// byte escaped; Kubernetes names and uids fit well inside.
const maxTokenLen = 3 * MaxNodeNameLen

// KeyError is returned for a node name, uid or key that is not safe to use as
// a NATS subject token: a '.', '*', '>' or space would let one node's key
// address, or match, another node's keys.
type KeyError struct {
	// What is being validated, e.g. "node" or "uid".
	What   string
	Value  string
	Reason string
}

func (e *KeyError) Error() string {
	return fmt.Sprintf("invalid %s %q: %s", e.What, e.Value, e.Reason)
}

// ValidateToken returns a *KeyError unless s is a single subject token made
// only of ASCII letters, digits, '-' and '_'.
func ValidateToken(what, s string) error {
	if s == "" {
		return &KeyError{What: what, Value: s, Reason: "must not be empty"}
	}
	if len(s) > maxTokenLen {
		return &KeyError{What: what, Value: s, Reason: fmt.Sprintf("longer than %d characters", maxTokenLen)}
	}
	for _, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_':
		default:
			return &KeyError{What: what, Value: s, Reason: fmt.Sprintf("contains %q; only letters, digits, '-' and '_' are allowed", r)}
		}
	}
	return nil
}

// NodeKeyPrefix is the key prefix every per-node key of a node starts with,
// including trailing dot, e.g. "node1." or, for node "node-1.rack-a",
// "node-1_rack-a." (NodeToken). Every key function here takes the node's
// real name and writes its token.
func NodeKeyPrefix(node string) (string, error) {
	if err := ValidateNodeName(node); err != nil {
		return "", err
	}
	return NodeToken(node) + ".", nil
}

// volumeToken is the key token that sets a node's volume keys apart from its
// guest keys: "<node>.volume.<uid>" has two tokens after the node, a guest
// key "<node>.<uid>" one, so a guest uid can never be mistaken for it.
const volumeToken = "volume"

// imageToken sets a node's image keys apart, as volumeToken does its volume
// keys: "<node>.image.<uid>".
const imageToken = "image"

// fabricToken sets a node's Fabric key apart: "<node>.fabric.peers" has two
// tokens after the node, so it is never a guest key.
const fabricToken = "fabric"

// NodeKey is the BucketNodes key of a node's heartbeat: "<node>".
func NodeKey(node string) (string, error) {
	if err := ValidateNodeName(node); err != nil {
		return "", err
	}
	return NodeToken(node), nil
}

// ParseNodeKey is the name of the node whose heartbeat key is key.
func ParseNodeKey(key string) (string, error) {
	if err := ValidateToken("node", key); err != nil {
		return "", err
	}
	return NodeFromToken(key)
}

// joinKey is "<node>.<kind>.<uid>", or "<node>.<uid>" without a kind.
func joinKey(node, kind, uid string) (string, error) {
	prefix, err := NodeKeyPrefix(node)
	if err != nil {
		return "", err
	}
	if err := ValidateToken("uid", uid); err != nil {
		return "", err
	}
	if kind != "" {
		return prefix + kind + "." + uid, nil
	}
	return prefix + uid, nil
}

// ParseKey splits a per-node key into its node's name and the rest, e.g.
// "node1.volume.abc" into "node1" and "volume.abc", or "node-1_rack-a.abc"
// into "node-1.rack-a" and "abc". Every token must be valid.
func ParseKey(key string) (node, rest string, err error) {
	token, rest, ok := strings.Cut(key, ".")
	if !ok {
		return "", "", &KeyError{What: "key", Value: key, Reason: "want <node>.<id>"}
	}
	if err := ValidateToken("node", token); err != nil {
		return "", "", err
	}
	if node, err = NodeFromToken(token); err != nil {
		return "", "", err
	}
	for _, t := range strings.Split(rest, ".") {
		if err := ValidateToken("key token", t); err != nil {
			return "", "", err
		}
	}
	return node, rest, nil
}

// Subject is the NATS subject a key of a bucket is stored on.
func Subject(bucket, key string) string {
	return "$KV." + bucket + "." + key
}

// Stream is the JetStream stream backing a bucket.
func Stream(bucket string) string {
	return "KV_" + bucket
}
