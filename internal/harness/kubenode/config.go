package kubenode

import (
	"encoding/json"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/pelletier/go-toml/v2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubeletv1beta1 "k8s.io/kubelet/config/v1beta1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
)

// The node's addresses, inside its network namespace only: the kubelet
// refuses a loopback node IP, so the node has an address of its own on its
// loopback link, and its pods a bridge and a subnet. No other namespace sees
// either, so every node of a machine may use the same. NodeIP is where the
// node's pods reach the ports Options.Forward forwards.
const (
	NodeIP = "10.251.0.1"
	// clusterCIDR holds every node's pod subnet (Options.PodSubnet).
	clusterCIDR = "10.251.0.0/16"
	// cniBin is where Debian's containernetworking-plugins installs the
	// bridge, host-local and loopback plugins.
	cniBin = "/usr/lib/cni"
)

// DefaultPodSubnet is a node's pod subnet unless Options.PodSubnet says.
var DefaultPodSubnet = netip.MustParsePrefix("10.251.1.0/24")

// PodSubnet is the i-th pod subnet (i from 1 to 254) of clusterCIDR, for
// nodes whose pods reach each other: the first is DefaultPodSubnet.
func PodSubnet(i int) netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 251, byte(i), 0}), 24)
}

// checkPodSubnet refuses a pod subnet outside clusterCIDR or holding
// NodeIP.
func checkPodSubnet(p netip.Prefix) error {
	if !netip.MustParsePrefix(clusterCIDR).Overlaps(p) || p.Bits() < 17 || p.Contains(netip.MustParseAddr(NodeIP)) {
		return errors.Errorf("pod subnet %s is not a subnet of %s without %s", p, clusterCIDR, NodeIP)
	}
	return nil
}

// kernelTunables are the sysctls the kubelet (pkg/kubelet/cm,
// setupKernelTunables) insists on, with the values it wants. They are the
// machine's, not a namespace's: the kubelet would set them for the whole
// machine (kernel.panic_on_oops=1 among them) or, with
// protectKernelDefaults, refuse to start where they differ. In the node's
// mount namespace a file holding each wanted value is bound over the
// sysctl, so the kubelet reads what it wants and the machine keeps its own.
var kernelTunables = map[string]string{
	"vm/overcommit_memory":      "1",
	"vm/panic_on_oom":           "0",
	"kernel/panic":              "10",
	"kernel/panic_on_oops":      "1",
	"kernel/keys/root_maxkeys":  "1000000",
	"kernel/keys/root_maxbytes": "25000000",
}

// containerdConfig is the part of containerd's configuration (version 2)
// the node sets; everything else keeps containerd's defaults.
type containerdConfig struct {
	Version int               `toml:"version"`
	Root    string            `toml:"root"`
	State   string            `toml:"state"`
	GRPC    containerdAddress `toml:"grpc"`
	TTRPC   containerdAddress `toml:"ttrpc"`
	Plugins containerdPlugins `toml:"plugins"`
}

type containerdAddress struct {
	Address string `toml:"address"`
}

type containerdPlugins struct {
	// Opt is where containerd would install packages, /opt/containerd by
	// default: the machine's.
	Opt struct {
		Path string `toml:"path"`
	} `toml:"io.containerd.internal.v1.opt"`
	CRI criConfig `toml:"io.containerd.grpc.v1.cri"`
}

type criConfig struct {
	SandboxImage string `toml:"sandbox_image"`
	// DisableApparmor: containerd would load its AppArmor profile into the
	// machine's kernel.
	DisableApparmor bool `toml:"disable_apparmor"`
	// RestrictOOMScoreAdj keeps containers' oom_score_adj no lower than
	// containerd's: the kubelet asks -998 for sandboxes and -997 for
	// Guaranteed pods, and lowering it needs CAP_SYS_RESOURCE, which the
	// test's processes may lack (runc then fails with "can't get final
	// child's PID from pipe").
	RestrictOOMScoreAdj bool   `toml:"restrict_oom_score_adj"`
	StreamServerAddress string `toml:"stream_server_address"`
	StreamServerPort    string `toml:"stream_server_port"`
	CNI                 struct {
		BinDir  string `toml:"bin_dir"`
		ConfDir string `toml:"conf_dir"`
	} `toml:"cni"`
	Containerd struct {
		Snapshotter        string                `toml:"snapshotter"`
		DefaultRuntimeName string                `toml:"default_runtime_name"`
		Runtimes           map[string]criRuntime `toml:"runtimes"`
	} `toml:"containerd"`
	Registry struct {
		// Mirrors let containerd pull from the test's registry over
		// plain HTTP.
		Mirrors map[string]criMirror `toml:"mirrors"`
	} `toml:"registry"`
}

type criRuntime struct {
	RuntimeType string `toml:"runtime_type"`
	Options     struct {
		// SystemdCgroup false: cgroupfs, as the kubelet's cgroupDriver;
		// there is no systemd here.
		SystemdCgroup bool `toml:"SystemdCgroup"`
	} `toml:"options"`
}

type criMirror struct {
	Endpoint []string `toml:"endpoint"`
}

// cniConfList is a CNI network configuration list (the CNI spec's
// format), what containerd reads from its conf_dir.
type cniConfList struct {
	CNIVersion string      `json:"cniVersion"`
	Name       string      `json:"name"`
	Plugins    []cniPlugin `json:"plugins"`
}

type cniPlugin struct {
	Type      string `json:"type"`
	Bridge    string `json:"bridge,omitempty"`
	IsGateway bool   `json:"isGateway,omitempty"`
	// IsDefaultGateway gives pods a default route through the bridge:
	// without it they reach their subnet only, not NodeIP.
	IsDefaultGateway bool     `json:"isDefaultGateway,omitempty"`
	IPAM             *cniIPAM `json:"ipam,omitempty"`
}

type cniIPAM struct {
	Type    string       `json:"type"`
	DataDir string       `json:"dataDir"`
	Ranges  [][]cniRange `json:"ranges"`
}

type cniRange struct {
	Subnet string `json:"subnet"`
}

// writeConfig writes the node's containerd, CNI and kubelet configuration
// and the kernel tunables' files into n.Dir.
func (n *Node) writeConfig(sandboxImage string, registries []string) error {
	var cc containerdConfig
	cc.Version = 2
	cc.Root, cc.State = n.path("containerd", "root"), n.path("containerd", "state")
	cc.GRPC.Address, cc.TTRPC.Address = n.ContainerdSocket, n.ContainerdSocket+".ttrpc"
	cc.Plugins.Opt.Path = n.path("containerd", "opt")
	cri := &cc.Plugins.CRI
	cri.SandboxImage = sandboxImage
	cri.DisableApparmor, cri.RestrictOOMScoreAdj = true, true
	cri.StreamServerAddress, cri.StreamServerPort = "127.0.0.1", "0"
	cri.CNI.BinDir, cri.CNI.ConfDir = cniBin, n.path("cni", "net.d")
	cri.Containerd.Snapshotter, cri.Containerd.DefaultRuntimeName = "overlayfs", "runc"
	cri.Containerd.Runtimes = map[string]criRuntime{"runc": {RuntimeType: "io.containerd.runc.v2"}}
	cri.Registry.Mirrors = map[string]criMirror{}
	for _, r := range registries {
		cri.Registry.Mirrors[r] = criMirror{Endpoint: []string{"http://" + r}}
	}
	b, err := toml.Marshal(cc)
	if err != nil {
		return errors.Wrap(err, "cannot encode containerd's configuration")
	}
	if err := n.write(b, "containerd.toml"); err != nil {
		return err
	}

	bridge := cniPlugin{Type: "bridge", Bridge: "cni0", IsGateway: true, IsDefaultGateway: true, IPAM: &cniIPAM{
		Type: "host-local", DataDir: n.path("cni", "ipam"), Ranges: [][]cniRange{{{Subnet: n.PodSubnet.String()}}},
	}}
	if b, err = json.Marshal(cniConfList{CNIVersion: "1.0.0", Name: "kubenode", Plugins: []cniPlugin{bridge}}); err != nil {
		return errors.Wrap(err, "cannot encode the CNI configuration")
	}
	if err := n.write(b, "cni", "net.d", "10-kubenode.conflist"); err != nil {
		return err
	}

	if b, err = yaml.Marshal(n.kubeletConfig()); err != nil {
		return errors.Wrap(err, "cannot encode the kubelet's configuration")
	}
	if err := n.write(b, "kubelet.yaml"); err != nil {
		return err
	}
	for name, v := range kernelTunables {
		if err := n.write([]byte(v+"\n"), "sysctl", name); err != nil {
			return err
		}
	}
	return nil
}

// kubeletConfig is the kubelet's configuration on this machine: cgroup v1
// through cgroupfs (no systemd), pods' cgroups under the node's own root,
// no swap check, and nothing written outside Dir.
func (n *Node) kubeletConfig() *kubeletv1beta1.KubeletConfiguration {
	return &kubeletv1beta1.KubeletConfiguration{
		TypeMeta: metav1.TypeMeta{APIVersion: kubeletv1beta1.SchemeGroupVersion.String(), Kind: "KubeletConfiguration"},
		// Reachable inside the node's namespace only; the API server
		// does not reach it (logs come back in terminated containers'
		// messages instead).
		Address:            NodeIP,
		HealthzBindAddress: "127.0.0.1",
		Authentication: kubeletv1beta1.KubeletAuthentication{
			Anonymous: kubeletv1beta1.KubeletAnonymousAuthentication{Enabled: ptr.To(true)},
			Webhook:   kubeletv1beta1.KubeletWebhookAuthentication{Enabled: ptr.To(false)},
		},
		Authorization:            kubeletv1beta1.KubeletAuthorization{Mode: kubeletv1beta1.KubeletAuthorizationModeAlwaysAllow},
		ContainerRuntimeEndpoint: "unix://" + n.ContainerdSocket,
		CgroupDriver:             "cgroupfs",
		CgroupRoot:               "/" + n.Cgroup,
		// kubelet 1.34 runs on cgroup v1 when told to; 1.35 refuses.
		FailCgroupV1:          ptr.To(false),
		FailSwapOn:            ptr.To(false),
		ProtectKernelDefaults: true,
		// Not lower than the test's own (see criConfig.RestrictOOMScoreAdj).
		OOMScoreAdj:     ptr.To[int32](0),
		VolumePluginDir: n.path("volume-plugins"),
		PodLogsDir:      n.path("log", "pods"),
		ClusterDomain:   "cluster.local",
		ClusterDNS:      []string{ClusterDNS},
		// The machine's disk is shared: eviction for lack of space would
		// depend on what others write.
		EvictionHard: map[string]string{
			"memory.available":  "1Mi",
			"nodefs.available":  "1%",
			"imagefs.available": "1%",
			"nodefs.inodesFree": "1%",
		},
		ImageGCHighThresholdPercent: ptr.To[int32](100),
		ImageGCLowThresholdPercent:  ptr.To[int32](99),
	}
}

// path is elem below the node's directory.
func (n *Node) path(elem ...string) string {
	return filepath.Join(append([]string{n.Dir}, elem...)...)
}

// write writes b to the file elem below the node's directory, creating its
// directory.
func (n *Node) write(b []byte, elem ...string) error {
	p := n.path(elem...)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return errors.Wrapf(err, "cannot create the directory of %s", p)
	}
	return errors.Wrapf(os.WriteFile(p, b, 0o644), "cannot write %s", p) //nolint:gosec // configuration, read by root's daemons
}
