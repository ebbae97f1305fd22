package openstacktest

import (
	"crypto/ed25519"
	"crypto/rand"
	"strings"

	"golang.org/x/crypto/ssh"
)

// PublicKey is a new ed25519 public key as an authorized_keys line with
// comment: real Nova parses a key to fingerprint it, so tests need real
// ones, not base64 that merely looks like a key.
func PublicKey(comment string) string {
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	key, err := ssh.NewPublicKey(pub)
	if err != nil {
		panic(err)
	}
	return strings.TrimSpace(string(ssh.MarshalAuthorizedKey(key))) + " " + comment
}
