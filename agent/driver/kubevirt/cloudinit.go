package kubevirt

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"slices"
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
	// Updates is set when the driver gives network data: KubeVirt keeps
	// the guest's instance-id across restarts, and cloud-init applies
	// network data only to a new instance unless told to on every boot,
	// so without it a changed address would never reach the guest.
	Updates *updatesConfig `json:"updates,omitempty"`
}

// updatesConfig is cloud-init's updates key: the boot events on which it
// applies the network configuration again.
type updatesConfig struct {
	Network updateEvents `json:"network"`
}

type updateEvents struct {
	When []string `json:"when"`
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
	if addressed(m) {
		cc.Updates = &updatesConfig{Network: updateEvents{When: []string{"boot-new-instance", "boot"}}}
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

// networkConfig is cloud-init's network configuration version 2 (netplan's
// format), which KubeVirt puts on the NoCloud disk as network-config.
type networkConfig struct {
	Version   int                 `json:"version"`
	Ethernets map[string]ethernet `json:"ethernets"`
}

// ethernet configures one interface, found by its MAC and renamed, so the
// guest's names follow the Machine's networks whatever its NICs' order.
type ethernet struct {
	Match     ethernetMatch `json:"match"`
	SetName   string        `json:"set-name"`
	DHCP4     bool          `json:"dhcp4,omitempty"`
	Addresses []string      `json:"addresses,omitempty"`
	Routes    []route       `json:"routes,omitempty"`
}

type ethernetMatch struct {
	MACAddress string `json:"macaddress"`
}

type route struct {
	To  string `json:"to"`
	Via string `json:"via"`
}

// maxNetworkData is KubeVirt's limit on inline cloud-init network data
// (cloudInitNetworkMaxLen in its VMI admission webhook).
const maxNetworkData = 2048

// addressed is whether the hub gave any of m's interfaces an address: only
// then does the driver configure the guest's network itself.
func addressed(m driver.Machine) bool {
	return slices.ContainsFunc(m.Networks, func(n driver.Network) bool { return n.Address.IsValid() })
}

// networkData is the guest's network configuration when the hub gave any
// interface an address, nil otherwise (the guest's image and the site's
// network decide, as before). A KubeVirt Multus network with bridge
// binding gets its address from the site's NetworkAttachmentDefinition,
// not from virtfleet, so the hub's address is configured in the guest
// statically: each interface eth<i> is found by its MAC (macFor); one with
// an address gets it, the first also the default route through its
// network's gateway; one without asks DHCP.
func networkData(m driver.Machine) ([]byte, error) {
	if !addressed(m) {
		return nil, nil
	}
	nc := networkConfig{Version: 2, Ethernets: map[string]ethernet{}}
	for i, n := range m.Networks {
		name := fmt.Sprintf("eth%d", i)
		eth := ethernet{Match: ethernetMatch{MACAddress: macFor(m.UID, i)}, SetName: name}
		if !n.Address.IsValid() {
			eth.DHCP4 = true
			nc.Ethernets[name] = eth
			continue
		}
		eth.Addresses = []string{n.Address.String()}
		if i == 0 {
			subnet, err := n.Subnet()
			if err != nil {
				return nil, err
			}
			eth.Routes = []route{{To: "0.0.0.0/0", Via: driver.Gateway(subnet).String()}}
		}
		nc.Ethernets[name] = eth
	}
	b, err := yaml.Marshal(nc)
	if err != nil {
		return nil, errors.Wrap(err, "cannot marshal cloud-init network data")
	}
	if len(b) > maxNetworkData {
		return nil, driver.Terminalf("cloud-init network data for %d interfaces is %d bytes; KubeVirt takes at most %d inline", len(m.Networks), len(b), maxNetworkData)
	}
	return b, nil
}

// macFor derives the MAC of the guest's interface index from its uid, as
// the libvirt driver does, under the locally administered unicast prefix
// 02: the same on every definition of the guest, so the network data can
// find the interface by it. KubeVirt passes the MAC a bridge binding asks
// for to the guest; one the driver does not set is the pod interface's.
func macFor(uid string, index int) string {
	s := sha256.Sum256([]byte(fmt.Sprintf("%s/%d", uid, index)))
	return fmt.Sprintf("02:%02x:%02x:%02x:%02x:%02x", s[0], s[1], s[2], s[3], s[4])
}
