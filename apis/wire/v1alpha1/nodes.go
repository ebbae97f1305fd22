package v1alpha1

import (
	"fmt"
	"strings"
)

// Node identity on the wire.
//
// A node is named as Kubernetes names it (spec.nodeName, often an FQDN such
// as "ip-10-0-0-1.ec2.internal"); a NATS subject token cannot contain '.',
// so every key carries the node's token instead, and every user-facing
// place (status, events, kubectl's NODE column) the real name. The token of
// a name is the name with:
//
//   - 'a'–'z', '0'–'9' and '-' kept as they are;
//   - '.' written as '_';
//   - any other byte b (uppercase letters, '_', anything a Kubernetes node
//     name cannot hold) written as '_' followed by two letters 'A'–'P', the
//     high and the low four bits of b ('A' is 0, 'P' is 15).
//
// So "node-1.rack-a.example.com" is "node-1_rack-a_example_com", and a name
// that was already a token and holds only lowercase letters, digits and '-'
// (node1) is its own token. The mapping is one to one: an escape is the
// only place an uppercase letter follows '_', so a token reads back
// unambiguously, and a token that is not the image of a name (an escape of
// a byte that stands for itself, a cut-off escape, an uppercase letter
// outside an escape) is refused.

// MaxNodeNameLen is the longest node name: Kubernetes' limit for a DNS
// subdomain.
const MaxNodeNameLen = 253

// ValidateNodeName returns a *KeyError for a name no node can have.
func ValidateNodeName(name string) error {
	if name == "" {
		return &KeyError{What: "node", Value: name, Reason: "must not be empty"}
	}
	if len(name) > MaxNodeNameLen {
		return &KeyError{What: "node", Value: name, Reason: fmt.Sprintf("longer than %d characters", MaxNodeNameLen)}
	}
	return nil
}

// NodeToken is the key token of the node named name (see above).
func NodeToken(name string) string {
	var b strings.Builder
	b.Grow(len(name))
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case keptInToken(c):
			b.WriteByte(c)
		case c == '.':
			b.WriteByte('_')
		default:
			b.WriteByte('_')
			b.WriteByte('A' + c>>4)
			b.WriteByte('A' + c&0x0f)
		}
	}
	return b.String()
}

// NodeFromToken is the node name whose token is token, or a *KeyError if
// token is no node's token.
func NodeFromToken(token string) (string, error) {
	bad := func(reason string) error { return &KeyError{What: "node token", Value: token, Reason: reason} }
	var b strings.Builder
	b.Grow(len(token))
	for i := 0; i < len(token); i++ {
		c := token[i]
		switch {
		case keptInToken(c):
			b.WriteByte(c)
		case c != '_':
			return "", bad(fmt.Sprintf("%q stands for no character of a node name", c))
		case i+1 < len(token) && isNibble(token[i+1]):
			if i+2 >= len(token) || !isNibble(token[i+2]) {
				return "", bad("an escape needs two letters A-P")
			}
			d := (token[i+1]-'A')<<4 | (token[i+2] - 'A')
			if keptInToken(d) || d == '.' {
				return "", bad(fmt.Sprintf("%q is escaped but stands for itself", d))
			}
			b.WriteByte(d)
			i += 2
		default:
			b.WriteByte('.')
		}
	}
	name := b.String()
	if err := ValidateNodeName(name); err != nil {
		return "", err
	}
	return name, nil
}

// keptInToken are the bytes a token holds as themselves.
func keptInToken(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-'
}

func isNibble(c byte) bool { return c >= 'A' && c <= 'P' }
