package guestimage

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/pem"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"golang.org/x/crypto/ssh"
)

// Served is the image on an HTTP server on 127.0.0.1, where an agent on
// this machine imports it from: the URL and SHA-256 a DiskImage names.
type Served struct {
	URL    string
	SHA256 string
	server *http.Server
}

// Close stops serving.
func (s *Served) Close() { _ = s.server.Close() }

// Serve serves the image at path on a free port of 127.0.0.1.
func Serve(path string) (*Served, error) {
	f, err := os.Open(path) //nolint:gosec // the cached image
	if err != nil {
		return nil, errors.Wrap(err, "cannot open the guest image")
	}
	defer func() { _ = f.Close() }()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return nil, errors.Wrap(err, "cannot read the guest image")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, errors.Wrap(err, "cannot listen for the guest image server")
	}
	srv := &http.Server{
		Handler:           http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { http.ServeFile(w, r, path) }),
		ReadHeaderTimeout: 10 * time.Second,
	}
	go func() { _ = srv.Serve(l) }()
	return &Served{
		URL:    "http://" + l.Addr().String() + "/" + filepath.Base(path),
		SHA256: hex.EncodeToString(h.Sum(nil)),
		server: srv,
	}, nil
}

// NewKey writes a fresh ed25519 private key, the one ssh logs into a guest
// with as DefaultUser, to file and returns the public half's
// authorized_keys line, which goes into the VM's publicKey.
func NewKey(file, comment string) (string, error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return "", errors.Wrap(err, "cannot make the guest's key")
	}
	sshPub, err := ssh.NewPublicKey(pub)
	if err != nil {
		return "", errors.Wrap(err, "cannot make the guest's key")
	}
	block, err := ssh.MarshalPrivateKey(priv, comment)
	if err != nil {
		return "", errors.Wrap(err, "cannot make the guest's key")
	}
	if err := os.WriteFile(file, pem.EncodeToMemory(block), 0o600); err != nil {
		return "", errors.Wrap(err, "cannot write the guest's key")
	}
	return strings.TrimSpace(string(ssh.MarshalAuthorizedKey(sshPub))), nil
}
