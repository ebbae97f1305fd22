package libvirt

import (
	"bytes"
	"encoding/json"
	"fmt"
	"mime/multipart"
	"net/textproto"
	"os"
	"strings"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/kdomanski/iso9660"

	"github.com/virtfleet/virtfleet/agent/driver"
)

// cloudConfig is virtfleet's own cloud-config. It is written as JSON, which
// is YAML too, so no YAML library or template is needed.
type cloudConfig struct {
	Hostname          string     `json:"hostname"`
	SSHAuthorizedKeys []string   `json:"ssh_authorized_keys,omitempty"`
	BootCmd           [][]string `json:"bootcmd,omitempty"`
}

// seedISO builds the cloud-init NoCloud seed: an ISO 9660 image labelled
// cidata holding meta-data and user-data.
func seedISO(m driver.Machine) ([]byte, error) {
	meta, err := json.Marshal(map[string]string{"instance-id": m.UID, "local-hostname": m.Name})
	if err != nil {
		return nil, errors.Wrap(err, "cannot marshal meta-data")
	}
	user, err := userData(m)
	if err != nil {
		return nil, err
	}
	w, err := iso9660.NewWriter()
	if err != nil {
		return nil, errors.Wrap(err, "cannot create seed ISO writer")
	}
	defer w.Cleanup() //nolint:errcheck // a leftover staging dir is harmless
	if err := w.AddFile(bytes.NewReader(meta), "meta-data"); err != nil {
		return nil, errors.Wrap(err, "cannot add meta-data to seed ISO")
	}
	if err := w.AddFile(bytes.NewReader(user), "user-data"); err != nil {
		return nil, errors.Wrap(err, "cannot add user-data to seed ISO")
	}
	var out bytes.Buffer
	if err := w.WriteTo(&out, "cidata"); err != nil {
		return nil, errors.Wrap(err, "cannot write seed ISO")
	}
	return out.Bytes(), nil
}

// writable fails unless the driver can write where it must: the temporary
// directory, where the iso9660 library stages each seed's files, and
// imageDir, where images are downloaded. A container with a read-only root
// filesystem and no volume there would otherwise fail every define; this way
// it fails at start-up, saying what to mount.
func writable(imageDir string) error {
	tmp, err := os.MkdirTemp("", "virtfleet-seed-")
	if err != nil {
		return errors.Wrapf(err, "cannot stage cloud-init seeds in the temporary directory %s (mount a writable volume there, or set TMPDIR)", os.TempDir())
	}
	if err := os.Remove(tmp); err != nil {
		return errors.Wrap(err, "cannot remove a staging directory")
	}
	if err := os.MkdirAll(imageDir, 0o700); err != nil {
		return errors.Wrapf(err, "cannot create the image download directory %s", imageDir)
	}
	f, err := os.CreateTemp(imageDir, "virtfleet-check-")
	if err != nil {
		return errors.Wrapf(err, "cannot download images to %s (mount a writable volume there, or set --image-dir)", imageDir)
	}
	_ = f.Close()
	return errors.Wrap(os.Remove(f.Name()), "cannot remove a file from the image download directory")
}

// userData is virtfleet's cloud-config alone, or — when the user gave user
// data — a MIME multipart with ours first and theirs merged after it.
func userData(m driver.Machine) ([]byte, error) {
	cc := cloudConfig{Hostname: m.Name}
	if m.PublicKey != "" {
		cc.SSHAuthorizedKeys = []string{m.PublicKey}
	}
	if m.SwapBytes > 0 {
		// bootcmd runs at every boot: format the swap disk once, enable it always.
		dev := "/dev/disk/by-id/virtio-" + swapSerial
		cc.BootCmd = [][]string{{"sh", "-c", fmt.Sprintf("blkid %[1]s >/dev/null || mkswap %[1]s; swapon %[1]s || true", dev)}}
	}
	own, err := json.Marshal(cc)
	if err != nil {
		return nil, errors.Wrap(err, "cannot marshal cloud-config")
	}
	own = append([]byte("#cloud-config\n"), own...)
	if m.UserData == "" {
		return own, nil
	}

	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	fmt.Fprintf(&buf, "Content-Type: multipart/mixed; boundary=%q\nMIME-Version: 1.0\n\n", mw.Boundary())
	parts := []struct {
		contentType string
		body        []byte
	}{
		{"text/cloud-config", own},
		{userDataType(m.UserData), []byte(m.UserData)},
	}
	for _, p := range parts {
		h := textproto.MIMEHeader{}
		h.Set("Content-Type", p.contentType)
		// Merge the user's lists and maps into ours instead of replacing them.
		h.Set("Merge-Type", "list(append)+dict(recurse_array,no_replace)+str()")
		pw, err := mw.CreatePart(h)
		if err != nil {
			return nil, errors.Wrap(err, "cannot write user-data part")
		}
		if _, err := pw.Write(p.body); err != nil {
			return nil, errors.Wrap(err, "cannot write user-data part")
		}
	}
	if err := mw.Close(); err != nil {
		return nil, errors.Wrap(err, "cannot finish user-data")
	}
	return buf.Bytes(), nil
}

// userDataType picks the MIME type cloud-init expects for user data, from its
// first line as cloud-init itself does.
func userDataType(s string) string {
	switch {
	case strings.HasPrefix(s, "#!"):
		return "text/x-shellscript"
	case strings.HasPrefix(s, "#cloud-boothook"):
		return "text/cloud-boothook"
	case strings.HasPrefix(s, "#include"):
		return "text/x-include-url"
	default:
		return "text/cloud-config"
	}
}
