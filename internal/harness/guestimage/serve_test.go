package guestimage

import (
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"
)

// The served URL returns the file, and the digest is the file's.
func TestServeServesTheFileWithItsDigest(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	body := []byte("not really a qcow2")
	require.NoError(t, os.WriteFile(path, body, 0o644))
	s, err := Serve(path)
	require.NoError(t, err)
	t.Cleanup(s.Close)

	sum := sha256.Sum256(body)
	assert.Equal(t, hex.EncodeToString(sum[:]), s.SHA256)
	rsp, err := http.Get(s.URL) //nolint:noctx // a test against 127.0.0.1
	require.NoError(t, err)
	defer func() { _ = rsp.Body.Close() }()
	got, err := io.ReadAll(rsp.Body)
	require.NoError(t, err)
	assert.Equal(t, body, got)
}

// The private key written is the pair of the returned public line.
func TestNewKeyWritesThePrivateHalfOfTheReturnedKey(t *testing.T) {
	file := filepath.Join(t.TempDir(), "id")
	line, err := NewKey(file, "test")
	require.NoError(t, err)
	pub, _, _, _, err := ssh.ParseAuthorizedKey([]byte(line))
	require.NoError(t, err)
	pem, err := os.ReadFile(file)
	require.NoError(t, err)
	signer, err := ssh.ParsePrivateKey(pem)
	require.NoError(t, err)
	assert.Equal(t, pub.Marshal(), signer.PublicKey().Marshal())
	fi, err := os.Stat(file)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
}
