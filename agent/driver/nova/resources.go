package nova

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strings"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/gophercloud/gophercloud/v2/openstack/blockstorage/v3/volumes"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/flavors"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/keypairs"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/networks"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/subnets"

	"github.com/virtfleet/virtfleet/agent/driver"
)

// What a server needs besides itself: a flavor for its shape, a keypair for
// its public key, Cinder volumes for its disks and Neutron networks.

// Prefix starts the names of what the driver creates in the cloud.
const Prefix = "vf-"

// Description marks the Neutron networks and Cinder volumes the driver
// created.
const Description = "created by virtfleet"

const (
	mib = 1 << 20
	gib = 1 << 30
)

// shape is what a flavor gives a server.
type shape struct {
	VCPU, RAMMiB, SwapMiB int
}

// shapeOf rounds memory and swap up to whole MiB, the flavor's unit.
func shapeOf(m driver.Machine) shape {
	return shape{VCPU: int(m.VCPU), RAMMiB: int((m.MemoryBytes + mib - 1) / mib), SwapMiB: int((m.SwapBytes + mib - 1) / mib)}
}

// flavorName is the deterministic name of the private flavor the driver
// creates for a shape no flavor has.
func flavorName(s shape) string {
	return fmt.Sprintf("%sc%d-m%d-s%d", Prefix, s.VCPU, s.RAMMiB, s.SwapMiB)
}

func (s shape) matches(f flavors.Flavor) bool {
	return f.VCPUs == s.VCPU && f.RAM == s.RAMMiB && f.Swap == s.SwapMiB && f.Ephemeral == 0
}

// ensureFlavor finds a flavor the project may use whose vcpus, ram and swap
// are exactly the shape's, public ones first, else makes the private flavor
// flavorName(s) and gives the project access to it.
func (d *Driver) ensureFlavor(ctx context.Context, s shape) (flavors.Flavor, error) {
	d.flavorMu.Lock()
	defer d.flavorMu.Unlock()
	usable, err := d.listFlavors(ctx, flavors.PublicAccess)
	if err != nil {
		return flavors.Flavor{}, err
	}
	slices.SortFunc(usable, func(a, b flavors.Flavor) int {
		if a.IsPublic != b.IsPublic {
			if a.IsPublic {
				return -1
			}
			return 1
		}
		return strings.Compare(a.Name, b.Name)
	})
	for _, f := range usable {
		if s.matches(f) && (f.IsPublic || f.Name == flavorName(s)) {
			return f, nil
		}
	}
	// Ours may exist without the project's access: made by an agent that
	// stopped before granting it.
	all, err := d.listFlavors(ctx, flavors.AllAccess)
	if err != nil {
		return flavors.Flavor{}, err
	}
	i := slices.IndexFunc(all, func(f flavors.Flavor) bool { return f.Name == flavorName(s) })
	var f flavors.Flavor
	if i >= 0 {
		f = all[i]
	} else {
		disk, public := 0, false
		created, err := flavors.Create(ctx, d.c.compute, flavors.CreateOpts{
			Name: flavorName(s), VCPUs: s.VCPU, RAM: s.RAMMiB, Disk: &disk, Swap: &s.SwapMiB, IsPublic: &public,
			Description: Description,
		}).Extract()
		if err != nil {
			return flavors.Flavor{}, classify(err, "cannot create flavor "+flavorName(s))
		}
		f = *created
	}
	_, err = flavors.AddAccess(ctx, d.c.compute, f.ID, flavors.AddAccessOpts{Tenant: d.c.projectID}).Extract()
	if err != nil && statusOf(err) != http.StatusConflict {
		return flavors.Flavor{}, classify(err, "cannot give the project access to flavor "+f.Name)
	}
	return f, nil
}

func (d *Driver) listFlavors(ctx context.Context, access flavors.AccessType) ([]flavors.Flavor, error) {
	page, err := flavors.ListDetail(d.c.compute, flavors.ListOpts{AccessType: access}).AllPages(ctx)
	if err != nil {
		return nil, classify(err, "cannot list flavors")
	}
	all, err := flavors.ExtractFlavors(page)
	return all, errors.Wrap(err, "cannot read flavors")
}

// listKeypairs names the keypairs of the agent's user.
func (d *Driver) listKeypairs(ctx context.Context) ([]string, error) {
	page, err := keypairs.List(d.c.compute, nil).AllPages(ctx)
	if err != nil {
		return nil, classify(err, "cannot list keypairs")
	}
	all, err := keypairs.ExtractKeyPairs(page)
	if err != nil {
		return nil, errors.Wrap(err, "cannot read keypairs")
	}
	names := make([]string, 0, len(all))
	for _, k := range all {
		names = append(names, k.Name)
	}
	return names, nil
}

// keypairName is the deterministic name of the keypair for a public key:
// the SHA-256 of the key itself, so a comment change keeps the keypair.
func keypairName(publicKey string) (string, error) {
	fields := strings.Fields(publicKey)
	if len(fields) < 2 {
		return "", driver.Terminalf("publicKey is not an OpenSSH public key line (type, key, comment)")
	}
	blob, err := base64.StdEncoding.DecodeString(fields[1])
	if err != nil || len(blob) == 0 {
		return "", driver.Terminalf("publicKey is not an OpenSSH public key line: its key is not base64")
	}
	sum := sha256.Sum256(blob)
	return Prefix + hex.EncodeToString(sum[:]), nil
}

// sameKey compares two public key lines by type and key, not comment.
func sameKey(a, b string) bool {
	fa, fb := strings.Fields(a), strings.Fields(b)
	return len(fa) >= 2 && len(fb) >= 2 && fa[0] == fb[0] && fa[1] == fb[1]
}

// ensureKeypair finds or imports the keypair for publicKey.
func (d *Driver) ensureKeypair(ctx context.Context, publicKey string) (string, error) {
	name, err := keypairName(publicKey)
	if err != nil {
		return "", err
	}
	kp, err := keypairs.Get(ctx, d.c.compute, name, nil).Extract()
	switch {
	case err == nil && sameKey(kp.PublicKey, publicKey):
		return name, nil
	case err == nil:
		return "", driver.Terminalf("keypair %s exists with another public key", name)
	case statusOf(err) != http.StatusNotFound:
		return "", classify(err, "cannot read keypair "+name)
	}
	_, err = keypairs.Create(ctx, d.c.compute, keypairs.CreateOpts{Name: name, PublicKey: publicKey}).Extract()
	switch {
	case statusOf(err) == http.StatusConflict:
		return name, nil // imported by someone else meanwhile
	case statusOf(err) == http.StatusBadRequest:
		return "", driver.Terminal(errors.Errorf("Nova refused the public key: %s", describe(err)))
	case err != nil:
		return "", classify(err, "cannot import keypair "+name)
	}
	return name, nil
}

// findVolume finds the volume named like disk, the oldest if names repeat
// (Cinder does not keep names unique).
func (d *Driver) findVolume(ctx context.Context, name string) (*volumes.Volume, error) {
	page, err := volumes.List(d.c.volume, volumes.ListOpts{Name: name}).AllPages(ctx)
	if err != nil {
		return nil, classify(err, "cannot list volumes")
	}
	all, err := volumes.ExtractVolumes(page)
	if err != nil {
		return nil, errors.Wrap(err, "cannot read volumes")
	}
	all = slices.DeleteFunc(all, func(v volumes.Volume) bool { return v.Name != name })
	if len(all) == 0 {
		return nil, nil
	}
	slices.SortFunc(all, func(a, b volumes.Volume) int {
		if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return &all[0], nil
}

// ensureVolume finds or creates the disk's volume; Pool, when set, is the
// Cinder volume type. A disk with an Image is created from the image's
// Glance copy, which it first makes present: while that import runs it
// returns an imageWait with the progress (importing tells). A disk whose
// Image copies a volume as a snapshot holds it is made from that volume's
// Cinder snapshot instead (volumeSnapshot): no image in between. Other
// volumes are made empty.
func (d *Driver) ensureVolume(ctx context.Context, disk driver.Disk) (*volumes.Volume, error) {
	v, err := d.findVolume(ctx, disk.Name)
	if err != nil || v != nil {
		return v, err
	}
	if disk.Imported {
		return nil, errors.Errorf("disk %s is an imported volume, and Cinder has no volume of that name", disk.Name)
	}
	size := int((disk.SizeBytes + gib - 1) / gib)
	if size < 1 {
		return nil, driver.Terminalf("disk %s: size must be positive, got %d bytes", disk.Name, disk.SizeBytes)
	}
	opts := volumes.CreateOpts{Name: disk.Name, Size: size, VolumeType: disk.Pool, Description: Description}
	switch {
	case disk.Image != nil && disk.Image.SourceSnapshot != "":
		sn, err := d.volumeSnapshot(ctx, disk.Image)
		if err != nil {
			return nil, err
		}
		// Cinder makes no volume smaller than its snapshot.
		opts.SnapshotID, opts.Size = sn.ID, max(size, sn.Size)
	case disk.Image != nil:
		d.imageUse.RLock()
		defer d.imageUse.RUnlock()
		if opts.ImageID, err = d.imageFor(ctx, disk.Image); err != nil {
			return nil, err
		}
	}
	v, err = volumes.Create(ctx, d.c.volume, opts, nil).Extract()
	return v, classify(err, "cannot create volume "+disk.Name)
}

// ensureNetwork finds the Neutron network named n.Name, the oldest if names
// repeat, or creates it with a DHCP subnet from n.CIDR whose gateway is its
// first address. A network the driver created without its subnet (an agent
// stopped in between) gets the subnet now. An imported network is looked up
// by name the same way and used as it is: never created nor given a subnet.
func (d *Driver) ensureNetwork(ctx context.Context, n driver.Network) (string, error) {
	d.networkMu.Lock()
	defer d.networkMu.Unlock()
	page, err := networks.List(d.c.network, networks.ListOpts{Name: n.Name}).AllPages(ctx)
	if err != nil {
		return "", classify(err, "cannot list networks")
	}
	all, err := networks.ExtractNetworks(page)
	if err != nil {
		return "", errors.Wrap(err, "cannot read networks")
	}
	all = slices.DeleteFunc(all, func(x networks.Network) bool { return x.Name != n.Name })
	slices.SortFunc(all, func(a, b networks.Network) int {
		if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	if len(all) > 0 && (n.Imported || len(all[0].Subnets) > 0 || all[0].Description != Description) {
		return all[0].ID, nil
	}
	if n.Imported {
		return "", errors.Errorf("network %q, which the VirtualNetwork imports, does not exist in Neutron", n.Name)
	}
	prefix, err := networkPrefix(n)
	if err != nil {
		return "", err
	}
	id := ""
	if len(all) > 0 {
		id = all[0].ID
	} else {
		created, err := networks.Create(ctx, d.c.network, networks.CreateOpts{Name: n.Name, Description: Description}).Extract()
		if err != nil {
			return "", classify(err, "cannot create network "+n.Name)
		}
		id = created.ID
	}
	gateway, dhcp := driver.Gateway(prefix).String(), true
	// The hub gives the servers their addresses, from the second host
	// address up, as fixed IPs. What Neutron hands out itself (a DHCP
	// agent's port) comes from a pool of the last host address alone, which
	// the hub gives a VM only once every other is taken.
	last := driver.HostAddr(prefix, driver.HostCount(prefix)).String()
	_, err = subnets.Create(ctx, d.c.network, subnets.CreateOpts{
		NetworkID: id, Name: n.Name, CIDR: prefix.String(), IPVersion: 4, GatewayIP: &gateway, EnableDHCP: &dhcp, Description: Description,
		AllocationPools: []subnets.AllocationPool{{Start: last, End: last}},
	}).Extract()
	return id, classify(err, "cannot create the subnet of network "+n.Name)
}

// networkPrefix checks that a missing network can be created.
func networkPrefix(n driver.Network) (netip.Prefix, error) {
	switch n.Mode {
	case driver.NetworkModeNAT, driver.NetworkModeIsolated, "":
	case driver.NetworkModeBridge:
		return netip.Prefix{}, driver.Terminalf("network %q does not exist in Neutron; a bridge network must be a provider network the cloud's operator creates", n.Name)
	default:
		return netip.Prefix{}, driver.Terminalf("network %q has unknown mode %q; want nat, bridge or isolated", n.Name, n.Mode)
	}
	if n.CIDR == "" {
		return netip.Prefix{}, driver.Terminalf("network %q does not exist in Neutron and has no cidr to create it from", n.Name)
	}
	prefix, err := netip.ParsePrefix(n.CIDR)
	if err != nil || !prefix.Addr().Is4() || prefix.Bits() > 30 {
		return netip.Prefix{}, driver.Terminalf("network %q: cidr %q is not an IPv4 subnet of at least 4 addresses", n.Name, n.CIDR)
	}
	return prefix.Masked(), nil
}

// DeleteVolume implements driver.Driver: it deletes the Cinder
// volume named d.Name, and refuses while a server has it attached.
func (d *Driver) DeleteVolume(ctx context.Context, disk driver.Disk) error {
	v, err := d.findVolume(ctx, disk.Name)
	if err != nil || v == nil {
		return err
	}
	if v.Status == "in-use" || len(v.Attachments) > 0 {
		return driver.InUsef("volume %s is attached to a server", disk.Name)
	}
	if err := d.unsnapshotted(ctx, v.ID, disk.Name); err != nil {
		return err
	}
	err = volumes.Delete(ctx, d.c.volume, v.ID, volumes.DeleteOpts{}).ExtractErr()
	if err != nil && statusOf(err) != http.StatusNotFound {
		return classify(err, "cannot delete volume "+disk.Name)
	}
	d.cacheMu.Lock()
	delete(d.volumeIDs, disk.Name)
	d.cacheMu.Unlock()
	return nil
}
