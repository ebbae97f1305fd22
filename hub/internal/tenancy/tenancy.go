// Package tenancy decides what a namespace may reach beyond what it owns.
//
// A tenant names only what is its own: its namespace's resources, and
// guests, volumes and networks virtfleet makes for them. Everything that
// belongs to a node or to another namespace (an existing guest, volume or
// network taken over by external name, a node chosen by hand, a host
// bridge, an image server on a private address) is reachable only where a
// cluster administrator granted it in a ClusterProviderConfig, which
// tenants cannot write. The hub asks For what a namespace was granted;
// the node's agent enforces the image sources, since it is the one that
// connects.
package tenancy

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	apisv1alpha1 "github.com/virtfleet/virtfleet/apis/v1alpha1"
)

// AllNamespaces in a grant's namespaces grants every namespace.
const AllNamespaces = "*"

// Grant is what one namespace may do beyond its own: the union of every
// TenantGrant that names it.
type Grant struct {
	Namespace string
	// Import: take over existing guests, volumes and networks by external
	// name.
	Import bool
	// ChooseNode: set compute.virtfleet.io/node by hand.
	ChooseNode bool
	// HostBridges the namespace's bridge-mode networks may join; "*" is any.
	HostBridges []string
	// ImageSources are the CIDRs outside the public internet its images
	// may be downloaded from.
	ImageSources []string
	// NetworkCIDRs its networks' cidrs must lie in; none means any.
	NetworkCIDRs []string
	// BackupLocations the namespace may back up to and restore from; "*"
	// is any.
	BackupLocations []string
	// RestoreFrom are the other namespaces whose backups the namespace
	// may restore; "*" is any.
	RestoreFrom []string
	// NATSServers (host:port) its ProviderConfigs may name besides the
	// ClusterProviderConfigs'; "*" is any.
	NATSServers []string
}

// For is what namespace was granted by the grants of every
// ClusterProviderConfig in cpcs.
func For(cpcs []apisv1alpha1.ClusterProviderConfig, namespace string) Grant {
	g := Grant{Namespace: namespace}
	for _, cpc := range cpcs {
		for _, tg := range cpc.Spec.Grants {
			if !slices.Contains(tg.Namespaces, namespace) && !slices.Contains(tg.Namespaces, AllNamespaces) {
				continue
			}
			g.Import = g.Import || tg.Import
			g.ChooseNode = g.ChooseNode || tg.ChooseNode
			g.HostBridges = appendNew(g.HostBridges, tg.HostBridges...)
			g.ImageSources = appendNew(g.ImageSources, tg.ImageSources...)
			g.NetworkCIDRs = appendNew(g.NetworkCIDRs, tg.NetworkCIDRs...)
			g.BackupLocations = appendNew(g.BackupLocations, tg.BackupLocations...)
			g.RestoreFrom = appendNew(g.RestoreFrom, tg.RestoreFrom...)
			g.NATSServers = appendNew(g.NATSServers, tg.NATSServers...)
		}
	}
	return g
}

func appendNew(to []string, from ...string) []string {
	for _, s := range from {
		if !slices.Contains(to, s) {
			to = append(to, s)
		}
	}
	return to
}

// RefusedError says what a resource asked for that its namespace was not
// granted, and how an administrator grants it. No retry mends it; changing
// the resource or the grants does.
type RefusedError struct {
	// What the resource asked for, in words a tenant recognises.
	What string
	// Namespace of the resource.
	Namespace string
	// Field of TenantGrant that would allow it.
	Field string
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("refused: %s; namespace %s may not reach what it does not own unless a cluster administrator grants it in a ClusterProviderConfig's spec.grants (%s)", e.What, e.Namespace, e.Field)
}

// CheckImport says whether the namespace may take over what kind names by
// external name; what it says of the object is only what the tenant wrote.
func (g Grant) CheckImport(kind, externalName string) error {
	if g.Import {
		return nil
	}
	return &RefusedError{What: fmt.Sprintf("the %s imports %q by crossplane.io/external-name, which virtfleet did not make for it", kind, externalName), Namespace: g.Namespace, Field: "import: true"}
}

// CheckNode says whether the namespace may place kind on node by hand.
func (g Grant) CheckNode(kind, node string) error {
	if g.ChooseNode {
		return nil
	}
	return &RefusedError{What: fmt.Sprintf("the %s names node %q in the annotation %s, which only virtfleet's placement sets", kind, node, v1alpha1.AnnotationNode), Namespace: g.Namespace, Field: "chooseNode: true"}
}

// CheckTargetNode says whether the namespace may name the node a
// VirtualMachineMigration moves its VM to (spec.targetNode): the same grant
// as choosing a VM's node.
func (g Grant) CheckTargetNode(node string) error {
	if g.ChooseNode {
		return nil
	}
	return &RefusedError{What: fmt.Sprintf("the VirtualMachineMigration names targetNode %q; the hub chooses the target unless the namespace may choose nodes", node), Namespace: g.Namespace, Field: "chooseNode: true"}
}

// CheckNetwork says whether the namespace may have the VirtualNetwork n:
// one that imports a node's network needs the import grant, one in bridge
// mode its host bridge granted, one virtfleet makes from a cidr that cidr
// inside the namespace's networkCIDRs, where it has any.
func (g Grant) CheckNetwork(n *v1alpha1.VirtualNetwork) error {
	ext := meta.GetExternalName(n)
	if ext != "" {
		if err := g.CheckImport(fmt.Sprintf("VirtualNetwork %s", n.Name), ext); err != nil {
			return err
		}
	}
	switch fp := n.Spec.ForProvider; {
	case fp.Mode == v1alpha1.NetworkModeBridge:
		return g.CheckBridge(fp.Bridge)
	case ext == "" && fp.CIDR != "":
		return g.CheckCIDR(n.Name, fp.CIDR)
	}
	return nil
}

// NeedsGrant is whether n asks for anything a namespace owns only by
// grant, or that its grants may confine (a cidr).
func NeedsGrant(n *v1alpha1.VirtualNetwork) bool {
	return meta.GetExternalName(n) != "" || n.Spec.ForProvider.Mode == v1alpha1.NetworkModeBridge || n.Spec.ForProvider.CIDR != ""
}

// CheckCIDR says whether the namespace's VirtualNetwork network may serve
// cidr: any cidr while no grant confines the namespace, else only one that
// lies inside a granted range.
func (g Grant) CheckCIDR(network, cidr string) error {
	if len(g.NetworkCIDRs) == 0 {
		return nil
	}
	p, err := netip.ParsePrefix(cidr)
	if err == nil {
		p = p.Masked()
		for _, s := range g.NetworkCIDRs {
			if r, err := netip.ParsePrefix(s); err == nil && r.Bits() <= p.Bits() && r.Masked().Contains(p.Addr()) {
				return nil
			}
		}
	}
	return &RefusedError{
		What:      fmt.Sprintf("the VirtualNetwork %s's spec.forProvider.cidr %s lies outside the ranges granted to the namespace (%s)", network, cidr, strings.Join(g.NetworkCIDRs, ", ")),
		Namespace: g.Namespace,
		Field:     fmt.Sprintf("networkCIDRs: [%s]", cidr),
	}
}

// CheckBridge says whether the namespace's bridge-mode networks may join the
// host bridge.
func (g Grant) CheckBridge(bridge string) error {
	if slices.Contains(g.HostBridges, bridge) || slices.Contains(g.HostBridges, AllNamespaces) {
		return nil
	}
	return &RefusedError{What: fmt.Sprintf("the VirtualNetwork joins host bridge %q", bridge), Namespace: g.Namespace, Field: fmt.Sprintf("hostBridges: [%s]", bridge)}
}

// CheckBackupLocation says whether the namespace may back up to, and
// restore from, the BackupLocation named location.
func (g Grant) CheckBackupLocation(location string) error {
	if slices.Contains(g.BackupLocations, location) || slices.Contains(g.BackupLocations, AllNamespaces) {
		return nil
	}
	return &RefusedError{What: fmt.Sprintf("the backup names BackupLocation %q", location), Namespace: g.Namespace, Field: fmt.Sprintf("backupLocations: [%s]", location)}
}

// CheckRestoreFrom says whether the namespace may make an image of a backup
// taken in namespace: its own always, another only where granted.
func (g Grant) CheckRestoreFrom(namespace string) error {
	if namespace == g.Namespace || slices.Contains(g.RestoreFrom, namespace) || slices.Contains(g.RestoreFrom, AllNamespaces) {
		return nil
	}
	return &RefusedError{What: fmt.Sprintf("the DiskImage restores a backup of namespace %q", namespace), Namespace: g.Namespace, Field: fmt.Sprintf("restoreFrom: [%s]", namespace)}
}

// CheckNATSServer says whether the namespace's ProviderConfigs may name the
// NATS server (host:port): one of a ClusterProviderConfig (clusterServers),
// which an administrator wrote, or one granted. Any other would have the
// hub dial, and hold a connection to, whatever address a tenant wrote.
func (g Grant) CheckNATSServer(server string, clusterServers []string) error {
	if slices.Contains(clusterServers, server) || slices.Contains(g.NATSServers, server) || slices.Contains(g.NATSServers, AllNamespaces) {
		return nil
	}
	return &RefusedError{What: fmt.Sprintf("the ProviderConfig names NATS server %s, which no ClusterProviderConfig names", server), Namespace: g.Namespace, Field: fmt.Sprintf("natsServers: [%s]", server)}
}
