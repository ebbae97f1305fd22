package kubevirt

import (
	"bytes"
	"encoding/json"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/agent/driver"
)

// cloudConfig is virtfleet's own cloud-config for a KubeVirt guest.
type cloudConfig struct {
	Hostname          string      `json:"hostname"`
	SSHAuthorizedKeys []string    `json:"ssh_authorized_keys,omitempty"`
	Swap              *swapConfig `json:"swap,omitempty"`
	WriteFiles        []writeFile `json:"write_files,omitempty"`
	RunCmd            [][]string  `json:"runcmd,omitempty"`
}

// swapConfig is cloud-init's cc_mounts swap file: KubeVirt guests get swap
// as a file on the root disk, not as a disk of its own as on libvirt, so no
// volume is made for it.
type swapConfig struct {
	Filename string `json:"filename"`
	Size     int64  `json:"size"`
}

type writeFile struct {
	Path        string `json:"path"`
	Permissions string `json:"permissions"`
	Content     string `json:"content"`
}

// userScript is where a user's shell-script user data is written and run
// from, once per instance, as cloud-init runs text/x-shellscript parts.
const userScript = "/var/lib/virtfleet/user-data"

// userData is the guest's cloud-config: virtfleet's, with the user's merged
// in the way the libvirt backend's MIME parts merge
// (list(append)+dict(recurse_array,no_replace)): lists are appended, maps
// merged, and where both set a value virtfleet's stays. A user script is
// written to a file and run from runcmd. Other kinds of user data
// (#include, boothooks, MIME) are refused: KubeVirt's inline user data is a
// single document.
func userData(m driver.Machine) ([]byte, error) {
	cc := cloudConfig{Hostname: m.Name}
	if m.PublicKey != "" {
		cc.SSHAuthorizedKeys = []string{m.PublicKey}
	}
	if m.SwapBytes > 0 {
		cc.Swap = &swapConfig{Filename: "/swap.img", Size: m.SwapBytes}
	}
	var theirs map[string]any
	switch ud := m.UserData; {
	case strings.TrimSpace(ud) == "":
	case strings.HasPrefix(ud, "#cloud-config"):
		if err := yaml.Unmarshal([]byte(ud), &theirs); err != nil {
			return nil, driver.Terminal(errors.Wrap(err, "user data is not a valid cloud-config"))
		}
	case strings.HasPrefix(ud, "#!"):
		cc.WriteFiles = []writeFile{{Path: userScript, Permissions: "0755", Content: ud}}
		cc.RunCmd = [][]string{{userScript}}
	default:
		first, _, _ := strings.Cut(ud, "\n")
		return nil, driver.Terminalf("user data starting with %q is not supported on kubevirt: use #cloud-config or a #! script", first)
	}
	// Through JSON, so the merge sees plain maps and lists.
	b, err := json.Marshal(cc)
	if err != nil {
		return nil, errors.Wrap(err, "cannot marshal cloud-config")
	}
	var ours map[string]any
	if err := json.Unmarshal(b, &ours); err != nil {
		return nil, errors.Wrap(err, "cannot unmarshal cloud-config")
	}
	out, err := yaml.Marshal(mergeConfig(ours, theirs))
	if err != nil {
		return nil, errors.Wrap(err, "cannot marshal cloud-config")
	}
	return append([]byte("#cloud-config\n"), bytes.TrimSpace(out)...), nil
}

// mergeConfig merges theirs into ours: maps recursively, lists appended,
// anything else kept as ours has it.
func mergeConfig(ours, theirs any) any {
	switch o := ours.(type) {
	case map[string]any:
		t, ok := theirs.(map[string]any)
		if !ok {
			return ours
		}
		for k, v := range t {
			if mine, set := o[k]; set {
				o[k] = mergeConfig(mine, v)
			} else {
				o[k] = v
			}
		}
		return o
	case []any:
		if t, ok := theirs.([]any); ok {
			return append(o, t...)
		}
	}
	return ours
}
