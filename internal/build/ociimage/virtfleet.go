package ociimage

// NonRootUser is the hub's user: distroless's "nonroot", which owns nothing
// in the image, so the hub can read its binary and nothing else.
const NonRootUser = "65532:65532"

// RootUser is the agent's user. The agent talks to the host's libvirtd over
// the hostPath socket /run/libvirt/libvirt-sock, which libvirtd creates owned
// by root with mode 0770 or 0777 depending on the distribution; as uid 0 the
// agent is the socket's owner and libvirtd grants it qemu:///system, while
// the DaemonSet drops every capability, so root in the container is only the
// owner of that socket, not a privileged process.
const RootUser = "0:0"

// Hub is the image of the hub, the provider's controller that Crossplane's
// package manager runs.
var Hub = Spec{
	Name:      "hub",
	GoPackage: "./hub",
	Path:      "/usr/local/bin/hub",
	User:      NonRootUser,
}

// Agent is the image of the agent, run by the DaemonSet on hypervisor nodes.
var Agent = Spec{
	Name:      "agent",
	GoPackage: "./agent",
	Path:      "/usr/local/bin/agent",
	User:      RootUser,
}

// Function is the image of the composition function, which Crossplane runs
// from the Function package. It is its own Go module (function/go.mod).
var Function = Spec{
	Name:      "function",
	Module:    "function",
	GoPackage: ".",
	Path:      "/usr/local/bin/function",
	User:      NonRootUser,
}

// NATS is an image of nats-server, the version go.mod requires, for
// clusters that pull from their own registry only, and for the tests'
// kubelets: cluster/deploy's StatefulSet runs it as it runs the official
// image (its arguments name the configuration file), under the user the
// StatefulSet sets.
var NATS = Spec{
	Name:      "nats",
	GoPackage: "github.com/nats-io/nats-server/v2",
	Path:      "/usr/local/bin/nats-server",
	User:      NonRootUser,
}

// Virtfleet are virtfleet's images, labelled with the source and version,
// whose binaries report that version.
func Virtfleet(version string) []Spec {
	specs := []Spec{Hub, Agent, Function}
	for i := range specs {
		specs[i].Version = version
		specs[i].Labels = map[string]string{
			"org.opencontainers.image.source":   "https://github.com/virtfleet/virtfleet",
			"org.opencontainers.image.version":  version,
			"org.opencontainers.image.title":    "virtfleet-" + specs[i].Name,
			"org.opencontainers.image.licenses": "Apache-2.0",
		}
	}
	return specs
}

// Ref is the reference an image is tagged with: registry/virtfleet-<name>:version.
func Ref(registry string, s Spec, version string) string {
	return registry + "/virtfleet-" + s.Name + ":" + version
}
