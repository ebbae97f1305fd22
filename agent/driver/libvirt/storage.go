package libvirt

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	golibvirt "github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"

	"github.com/virtfleet/virtfleet/agent/driver"
)

// ensureVolume creates an empty volume unless one of that name exists, and
// says whether it made it. An existing volume is never resized or
// rewritten: it may hold user data.
func ensureVolume(api API, pool, name string, size int64, format string) (bool, error) {
	p, err := api.StoragePoolLookupByName(pool)
	if isCode(err, golibvirt.ErrNoStoragePool) {
		return false, driver.Terminalf("storage pool %q does not exist on this node", pool)
	}
	if err != nil {
		return false, errors.Wrapf(err, "cannot look up storage pool %s", pool)
	}
	if _, err := api.StorageVolLookupByName(p, name); err == nil {
		return false, nil
	} else if !isCode(err, golibvirt.ErrNoStorageVol) {
		return false, errors.Wrapf(err, "cannot look up volume %s", name)
	}
	_, err = createVolume(api, p, name, size, format)
	return err == nil, err
}

func createVolume(api API, p golibvirt.StoragePool, name string, size int64, format string) (golibvirt.StorageVol, error) {
	return createVolumeFrom(api, p, &libvirtxml.StorageVolume{
		Name:     name,
		Capacity: &libvirtxml.StorageVolumeSize{Value: uint64(max(size, 0)), Unit: "B"},
		Target:   &libvirtxml.StorageVolumeTarget{Format: &libvirtxml.StorageVolumeTargetFormat{Type: format}},
	}, nil)
}

// qcow2Compat is the qcow2 version the driver makes volumes in: 1.1 is
// version 3, the one QEMU keeps dirty bitmaps (a backup's checkpoint) in.
const qcow2Compat = "1.1"

// roomIn refuses need bytes more in pool p when it has less free: what,
// the thing that needs them, begins the Terminal error.
func roomIn(api API, p golibvirt.StoragePool, need uint64, what string) error {
	_, capacity, _, available, err := api.StoragePoolGetInfo(p)
	if err != nil {
		return errors.Wrapf(err, "cannot read storage pool %s", p.Name)
	}
	if need > available {
		return driver.Terminalf("%s needs %d bytes but storage pool %q has %d of %d bytes free", what, need, p.Name, available, capacity)
	}
	return nil
}

// createVolumeFrom creates v — as a copy of from, if set — once it is sure
// the pool has room for v's capacity.
func createVolumeFrom(api API, p golibvirt.StoragePool, v *libvirtxml.StorageVolume, from *golibvirt.StorageVol) (golibvirt.StorageVol, error) {
	size := v.Capacity.Value
	if size == 0 {
		return golibvirt.StorageVol{}, driver.Terminalf("volume %q needs a size greater than zero", v.Name)
	}
	if err := roomIn(api, p, size, fmt.Sprintf("volume %q", v.Name)); err != nil {
		return golibvirt.StorageVol{}, err
	}
	if v.Target != nil && v.Target.Format != nil && v.Target.Format.Type == "qcow2" && v.Target.Compat == "" {
		// libvirt 9.0 makes qcow2 version 2 (compat 0.10) unless told,
		// and QEMU keeps no persistent dirty bitmap, so no checkpoint for
		// an incremental backup, in a version 2 image.
		v.Target.Compat = qcow2Compat
	}
	x, err := v.Marshal()
	if err != nil {
		return golibvirt.StorageVol{}, errors.Wrap(err, "cannot marshal volume XML")
	}
	var made golibvirt.StorageVol
	if from != nil {
		made, err = api.StorageVolCreateXMLFrom(p, x, *from, 0)
	} else {
		made, err = api.StorageVolCreateXML(p, x, 0)
	}
	return made, errors.Wrapf(err, "cannot create volume %s", v.Name)
}

// writeSeed replaces the guest's seed volume with iso. uploadOptional is set
// for libvirt's test driver, which has no StorageVolUpload: there the volume
// exists with the right size but no content, which no simulated guest reads.
func writeSeed(api API, pool, name string, iso []byte, uploadOptional bool) error {
	p, err := api.StoragePoolLookupByName(pool)
	if err != nil {
		return errors.Wrapf(err, "cannot look up storage pool %s", pool)
	}
	if err := deleteVolume(api, pool, name); err != nil {
		return err
	}
	v, err := createVolume(api, p, name, int64(len(iso)), "raw")
	if err != nil {
		return err
	}
	err = api.StorageVolUpload(v, bytes.NewReader(iso), 0, uint64(len(iso)), 0)
	if uploadOptional && isCode(err, golibvirt.ErrNoSupport) {
		return nil
	}
	return errors.Wrap(err, "cannot upload cloud-init seed")
}

// inSharedPool is whether pool is one other than the driver's own: a pool
// on shared storage (a directory on NFS that every host of a group mounts,
// declared by the administrator under the same name on each), which holds
// volumes other hosts make.
func (d *Driver) inSharedPool(pool string) bool { return pool != "" && pool != d.pool }

// refreshShared has libvirtd re-read a shared pool (inSharedPool) before a
// volume of it is looked up: libvirtd knows of a volume another host made
// there only once it has, and without it such a volume would not be found
// and would be made again over the other's. A pool that is not there is
// left for the lookup to report.
func (d *Driver) refreshShared(api API, pool string) error {
	if !d.inSharedPool(pool) {
		return nil
	}
	p, err := api.StoragePoolLookupByName(pool)
	switch {
	case isCode(err, golibvirt.ErrNoStoragePool):
		return nil
	case err != nil:
		return errors.Wrapf(err, "cannot look up storage pool %s", pool)
	}
	return errors.Wrapf(api.StoragePoolRefresh(p, 0), "cannot refresh shared storage pool %s", pool)
}

// refreshDiskPools refreshes each shared pool m's disks are in, once.
func (d *Driver) refreshDiskPools(api API, m driver.Machine) error {
	var done []string
	for _, disk := range m.Disks {
		if slices.Contains(done, disk.Pool) {
			continue
		}
		done = append(done, disk.Pool)
		if err := d.refreshShared(api, disk.Pool); err != nil {
			return err
		}
	}
	return nil
}

// findVolume looks up volume name in pool. When either is missing it
// returns a NotFound error that says which.
func findVolume(api API, pool, name string) (golibvirt.StorageVol, error) {
	p, err := api.StoragePoolLookupByName(pool)
	if isCode(err, golibvirt.ErrNoStoragePool) {
		return golibvirt.StorageVol{}, driver.NotFoundf("no storage pool %s", pool)
	}
	if err != nil {
		return golibvirt.StorageVol{}, errors.Wrapf(err, "cannot look up storage pool %s", pool)
	}
	v, err := api.StorageVolLookupByName(p, name)
	if isCode(err, golibvirt.ErrNoStorageVol) {
		return golibvirt.StorageVol{}, driver.NotFoundf("no volume %s in storage pool %s", name, pool)
	}
	return v, errors.Wrapf(err, "cannot look up volume %s", name)
}

// deleteVolume deletes a volume if it exists.
func deleteVolume(api API, pool, name string) error {
	v, err := findVolume(api, pool, name)
	if driver.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	return errors.Wrapf(api.StorageVolDelete(v, 0), "cannot delete volume %s", name)
}

// DeleteVolume implements driver.Driver. It refuses while any domain of the
// node has the volume as a disk, in its running or its next definition: a
// guest of the driver, an orphan, or a domain virtfleet never made (an
// imported volume may be one's disk, as a pool volume or as its file). A disk
// made from an image stops backing it here; PruneImages removes the image
// after its PruneAfter.
func (d *Driver) DeleteVolume(_ context.Context, disk driver.Disk) error {
	api, _, err := d.api()
	if err != nil {
		return err
	}
	if err := d.refreshShared(api, disk.Pool); err != nil {
		return err
	}
	want := poolVolume{pool: cmp.Or(disk.Pool, d.pool), name: disk.Name}
	path, err := volumePath(api, want)
	if err != nil || path == "" {
		return err // nil: nothing to delete
	}
	doms, infos, err := d.listDomains(api, false)
	if err != nil {
		return err
	}
	for i, dom := range doms {
		nextInfo, err := d.nextDefinition(api, dom)
		if isCode(err, golibvirt.ErrNoDomain) {
			continue
		}
		if err != nil {
			return err
		}
		if !slices.Contains(infos[i].volumes, want) && !slices.Contains(nextInfo.volumes, want) &&
			!slices.Contains(infos[i].files, path) && !slices.Contains(nextInfo.files, path) {
			continue
		}
		switch o := infos[i].owner; {
		case o == nil:
			return driver.InUsef("volume %s is a disk of domain %s, which virtfleet does not manage; it is deleted once the domain no longer has it", disk.Name, dom.Name)
		case o.Orphaned:
			return driver.InUsef("volume %s is a disk of guest %s, orphaned from VirtualMachine %s/%s; it is deleted once the guest is gone", disk.Name, o.UID, o.Namespace, o.Name)
		default:
			return driver.InUsef("volume %s is attached to guest %s (VirtualMachine %s/%s); it is deleted once the guest is gone",
				disk.Name, o.UID, o.Namespace, o.Name)
		}
	}
	return deleteVolume(api, want.pool, want.name)
}

// nextDefinition reads dom's next definition, the one its next start
// runs, through d.definitions; an error with ErrNoDomain when it is gone.
func (d *Driver) nextDefinition(api API, dom golibvirt.Domain) (domainInfo, error) {
	return d.definitions.readAs(api, d.generationNow(), dom, golibvirt.DomainXMLInactive)
}

// volumePath is the path of volume v, or "" when there is no such volume.
func volumePath(api API, v poolVolume) (string, error) {
	vol, err := findVolume(api, v.pool, v.name)
	if driver.IsNotFound(err) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	path, err := api.StorageVolGetPath(vol)
	return path, errors.Wrapf(err, "cannot read the path of volume %s", v.name)
}

var _ driver.VolumeImporter = (*Driver)(nil)

// ObserveVolume implements driver.VolumeImporter.
func (d *Driver) ObserveVolume(_ context.Context, disk driver.Disk) (driver.VolumeObservation, error) {
	if ownVolume(disk.Name) {
		return driver.VolumeObservation{}, driver.Terminalf("volume %s is one node %s keeps for itself (an image, or a guest's seed or swap); no Volume can import it", disk.Name, d.node)
	}
	api, _, err := d.api()
	if err != nil {
		return driver.VolumeObservation{}, err
	}
	if err := d.refreshShared(api, disk.Pool); err != nil {
		return driver.VolumeObservation{}, err
	}
	v, err := findVolume(api, cmp.Or(disk.Pool, d.pool), disk.Name)
	if driver.IsNotFound(err) {
		return driver.VolumeObservation{}, driver.NotFoundf("%v on node %s", err, d.node)
	}
	if err != nil {
		return driver.VolumeObservation{}, err
	}
	_, capacity, _, err := api.StorageVolGetInfo(v)
	if err != nil {
		return driver.VolumeObservation{}, errors.Wrapf(err, "cannot read volume %s", disk.Name)
	}
	return driver.VolumeObservation{ID: v.Key, SizeBytes: int64(capacity)}, nil //nolint:gosec // a volume's capacity fits
}

// importedFormat is the format of the imported volume name (raw when the
// pool does not say), which the guest's disk must be opened with.
func (d *Driver) importedFormat(api API, pool, name string) (string, error) {
	if ownVolume(name) {
		return "", driver.Terminalf("volume %s is one node %s keeps for itself (an image, or a guest's seed or swap); no guest can attach it as an imported volume", name, d.node)
	}
	f, err := volumeFormat(api, pool, name)
	if driver.IsNotFound(err) {
		return "", errors.Errorf("the imported volume is not there: %v on node %s", err, d.node)
	}
	return f, err
}

// volumeFormat is the format of volume name of pool as the pool knows it
// (raw when it does not say); an error satisfying driver.IsNotFound when
// there is no such volume.
func volumeFormat(api API, pool, name string) (string, error) {
	v, err := findVolume(api, pool, name)
	if err != nil {
		return "", err
	}
	def, err := volumeDef(api, v)
	if err != nil {
		return "", err
	}
	return formatOf(def), nil
}

// volumeDef is the definition of volume v as libvirt has it now.
func volumeDef(api API, v golibvirt.StorageVol) (*libvirtxml.StorageVolume, error) {
	x, err := api.StorageVolGetXMLDesc(v, 0)
	if err != nil {
		return nil, errors.Wrapf(err, "cannot read volume %s", v.Name)
	}
	def := &libvirtxml.StorageVolume{}
	if err := def.Unmarshal(x); err != nil {
		return nil, errors.Wrapf(err, "cannot parse volume %s", v.Name)
	}
	return def, nil
}

// formatOf is the format of the volume def describes (raw when it does
// not say).
func formatOf(def *libvirtxml.StorageVolume) string {
	if def.Target != nil && def.Target.Format != nil && def.Target.Format.Type != "" {
		return def.Target.Format.Type
	}
	return "raw"
}

// ownVolume is whether name is a volume the driver makes for itself: an
// image and the markers of one being made, a guest's seed or swap, or what
// a backup of a guest makes for the while.
func ownVolume(name string) bool {
	for _, prefix := range []string{imagePrefix, clonePrefix, uploadPrefix} {
		if strings.HasPrefix(name, prefix) {
			return true
		}
	}
	return strings.HasSuffix(name, seedSuffix) || strings.HasSuffix(name, swapSuffix) || strings.HasSuffix(name, backupSuffix)
}

// poolHandles remembers the storage pools one operation looked up, and
// their room: making a guest's disk, swap and seed would otherwise look the
// same pool up five times and read its room three, a round trip to libvirtd
// each. A handle outlives its pool only for the operation's few
// milliseconds, and a call made with it then fails as the lookup would
// have. The room is the pool's when the operation first asked: the volumes
// it makes meanwhile are sparse (a seed's few hundred KiB are written), so
// each is still checked against what the pool has free, as read once.
type poolHandles struct {
	API
	pools map[string]golibvirt.StoragePool
	rooms map[string]poolRoom
}

// poolRoom is what StoragePoolGetInfo says of a pool.
type poolRoom struct {
	state                           uint8
	capacity, allocation, available uint64
}

func rememberPools(api API) API {
	return &poolHandles{API: api, pools: map[string]golibvirt.StoragePool{}, rooms: map[string]poolRoom{}}
}

func (p *poolHandles) StoragePoolGetInfo(pool golibvirt.StoragePool) (uint8, uint64, uint64, uint64, error) {
	r, ok := p.rooms[pool.Name]
	if !ok {
		var err error
		if r.state, r.capacity, r.allocation, r.available, err = p.API.StoragePoolGetInfo(pool); err != nil {
			return 0, 0, 0, 0, err
		}
		p.rooms[pool.Name] = r
	}
	return r.state, r.capacity, r.allocation, r.available, nil
}

func (p *poolHandles) StoragePoolLookupByName(name string) (golibvirt.StoragePool, error) {
	if h, ok := p.pools[name]; ok {
		return h, nil
	}
	h, err := p.API.StoragePoolLookupByName(name)
	if err == nil {
		p.pools[name] = h
	}
	return h, err
}
