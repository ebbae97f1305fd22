package stack

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"path"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	apisv1alpha1 "github.com/virtfleet/virtfleet/apis/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/harness/diskimagetest"
	"github.com/virtfleet/virtfleet/internal/harness/manifests"
)

// imageSize is the size of the generated disk image the stack serves: big
// enough to show import progress, small enough to import in a blink.
const imageSize = 4 << 20

// imageServer serves one generated disk image under any path on 127.0.0.1,
// standing in for the image hosts the examples name: the stack has no
// internet, and libvirt's test driver never reads the bytes anyway. The
// image is a qcow2 header without backing or data file, which the agents
// inspect, followed by random bytes.
type imageServer struct {
	srv    *http.Server
	url    string
	digest string
}

func startImageServer() (*imageServer, error) {
	content := make([]byte, imageSize)
	r := rand.New(rand.NewPCG(1, 2)) //nolint:gosec // deterministic test content, not a secret
	for i := range content {
		content[i] = byte(r.Uint32())
	}
	copy(content, diskimagetest.QCOW2Header())
	sum := sha256.Sum256(content)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, errors.Wrap(err, "cannot listen for the image server")
	}
	s := &imageServer{
		srv: &http.Server{
			Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				http.ServeContent(w, r, path.Base(r.URL.Path), time.Time{}, bytes.NewReader(content))
			}),
			ReadHeaderTimeout: 10 * time.Second,
		},
		url:    "http://" + l.Addr().String(),
		digest: hex.EncodeToString(sum[:]),
	}
	go func() { _ = s.srv.Serve(l) }()
	return s, nil
}

func (s *imageServer) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = s.srv.Shutdown(ctx)
}

// ImageURL is where the stack serves an image with the given file name.
func (s *Stack) ImageURL(name string) string {
	return s.images.url + "/" + name
}

// ImageSHA256 is the hex digest of every image the stack serves.
func (s *Stack) ImageSHA256() string {
	return s.images.digest
}

// ApplyExamples applies the manifests below dirs the way this stack can run
// them: without the example ClusterProviderConfig named default (the stack
// made its own, pointing at its own NATS and credentials), and with every
// DiskImage downloading from the stack's image server, checksum included.
func (s *Stack) ApplyExamples(ctx context.Context, dirs ...string) ([]*unstructured.Unstructured, error) {
	objs, err := manifests.Load(dirs...)
	if err != nil {
		return nil, err
	}
	out := objs[:0]
	for _, o := range objs {
		switch o.GetKind() {
		case apisv1alpha1.ClusterProviderConfigKind:
			if o.GetName() == "default" {
				continue
			}
		case v1alpha1.DiskImageKind:
			if err := s.localImage(o); err != nil {
				return nil, err
			}
		}
		out = append(out, o)
	}
	return out, s.ControlPlane.ApplyObjects(ctx, out)
}

// localImage points a DiskImage with a url source at the stack's server.
func (s *Stack) localImage(o *unstructured.Unstructured) error {
	raw, found, err := unstructured.NestedString(o.Object, "spec", "forProvider", "source", "url")
	if err != nil || !found {
		return err
	}
	u, err := url.Parse(raw)
	if err != nil {
		return errors.Wrapf(err, "DiskImage %s has a bad url", o.GetName())
	}
	if err := unstructured.SetNestedField(o.Object, s.ImageURL(path.Base(u.Path)), "spec", "forProvider", "source", "url"); err != nil {
		return err
	}
	return unstructured.SetNestedField(o.Object, s.ImageSHA256(), "spec", "forProvider", "source", "sha256")
}
