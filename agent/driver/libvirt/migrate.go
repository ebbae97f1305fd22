package libvirt

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	golibvirt "github.com/digitalocean/go-libvirt"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/virtfleet/virtfleet/agent/driver"
)

// A live migration (driver.Migrator) is libvirt's peer-to-peer migration
// with a full copy of the guest's disks: the source's libvirtd connects to
// the target's (MigrationTarget.URI); the target's makes a volume for each
// writable disk of the guest, in the pool of the same name, and QEMU
// mirrors the disks there over NBD while the memory follows. The domain
// goes with its metadata, so the target's driver manages it as the same
// VM, and with its next definition, which the target keeps (PERSIST_DEST).
//
// What the migration does not carry, PrepareIncoming makes on the target
// first: the cloud-init seed (a read-only disk, which libvirt does not
// copy) and the guest's networks with the DHCP reservations of its MACs.
// It also makes the volumes of the guest's qcow2 disks, empty, where it
// knows their size: libvirt 9.0 would make them in qcow2 version 2 (compat
// 0.10), which keeps no dirty bitmap, and the guest's backups on the target
// would fail (see backup.go). libvirt copies into a volume that is there
// and makes only the missing ones.

var _ driver.Migrator = (*Driver)(nil)

// migrateFlags are live, driven by the source's libvirtd, defined on the
// target once it runs there, disks copied whole. libvirt is not asked to
// undefine the source (UNDEFINE_SOURCE): the migration's statistics are
// read from the source's domain first, then the driver removes it with
// what else the guest left on the node.
const migrateFlags = golibvirt.MigrateLive | golibvirt.MigratePeer2peer | golibvirt.MigratePersistDest | golibvirt.MigrateNonSharedDisk

// Typed parameters of a migration (VIR_MIGRATE_PARAM_*) and fields of a
// job's statistics (VIR_DOMAIN_JOB_*) the driver uses.
const (
	paramMigrateURI    = "migrate_uri"
	paramListenAddress = "listen_address"

	jobDataTotal     = "data_total"
	jobDataProcessed = "data_processed"
	jobDowntime      = "downtime" // milliseconds
)

// migration is the last live migration the driver started of one guest.
// It is kept while the process lives, so that its final status is there
// for its ID once the guest is gone from the node.
type migration struct {
	status driver.MigrationStatus
	// node names the target in messages.
	node string
	dom  golibvirt.Domain
	// copied are the volumes of the guest's disks the migration copies:
	// their copies here go once the guest runs on the target.
	copied []poolVolume
	// moved is set once the guest runs on the target, and left while what
	// it left on this node is not all gone.
	moved, left bool
}

// incoming is a guest PrepareIncoming readied for a migration to this node.
type incoming struct {
	// nics are the guest's interfaces, held as in use (Driver.defining)
	// until the guest is here or is deleted: no domain of the node has
	// them before, and the network sweep would take away their networks
	// and reservations.
	nics []nic
	// seed is the spec hash of the Machine the seed was written for.
	seed string
	// absent are the volumes of the guest's disks that were not on the
	// node when it was readied: the target's libvirt makes them before it
	// copies the disks and leaves them when the migration fails.
	absent []poolVolume
}

// PrepareIncoming implements driver.Migrator.
func (d *Driver) PrepareIncoming(_ context.Context, m driver.Machine) error {
	if err := validate(m); err != nil {
		return err
	}
	if err := movable(m); err != nil {
		return err
	}
	for _, n := range m.Networks {
		if err := d.checkNetwork(n); err != nil {
			return err
		}
	}
	api, _, err := d.api()
	if err != nil {
		return err
	}
	api = rememberPools(api)
	here, err := d.arrivedHere(api, m.UID)
	if err != nil || here {
		return err
	}
	absent, err := d.checkPools(api, m)
	if err != nil {
		return err
	}
	if err := d.readyNetworks(api, m, absent); err != nil {
		return err
	}
	if err := d.readyDisks(api, m, absent); err != nil {
		return err
	}
	return d.readySeed(api, m)
}

// readyDisks makes the volumes of m's qcow2 disks among absent in qcow2
// version 3, empty, of the size the guest's disk has on its node, for the
// migration to copy into. That size is the Disk's, or its image's where the
// image is larger (ensureImageDisk); a disk from an image the node does not
// hold is left for libvirt to make, in version 2: a volume of another size
// than the source's would fail the copy ("Source and target image have
// different sizes"). The volumes are absent ones, which a failed migration
// takes away again (dropIncoming).
func (d *Driver) readyDisks(api API, m driver.Machine, absent []poolVolume) error {
	for _, disk := range m.Disks {
		v := poolVolume{pool: cmp.Or(disk.Pool, d.pool), name: disk.Name}
		if cmp.Or(disk.Format, defaultFormat) != "qcow2" || !slices.Contains(absent, v) {
			continue
		}
		size, known, err := d.incomingSize(api, disk)
		if err != nil {
			return err
		}
		if !known {
			continue
		}
		if _, err := createSparse(api, v.pool, v.name, size, "qcow2"); err != nil {
			return errors.Wrapf(err, "cannot make the volume of disk %s for the incoming guest", disk.Name)
		}
	}
	return nil
}

// incomingSize is the size disk has on the node a guest comes from, as the
// driver made it there, and whether this node can tell.
func (d *Driver) incomingSize(api API, disk driver.Disk) (int64, bool, error) {
	if disk.Image == nil {
		return disk.SizeBytes, disk.SizeBytes > 0, nil
	}
	iv, err := findVolume(api, d.pool, imageVolume(disk.Image.UID))
	switch {
	case driver.IsNotFound(err):
		return 0, false, nil
	case err != nil:
		return 0, false, err
	}
	_, imageSize, _, err := api.StorageVolGetInfo(iv)
	if err != nil {
		return 0, false, errors.Wrapf(err, "cannot read image %s", disk.Image.Name)
	}
	return max(disk.SizeBytes, int64(imageSize)), true, nil //nolint:gosec // an image's size fits
}

// arrivedHere says whether the guest's domain is active on the node:
// running, or arriving. A domain of its uid that is not the guest's stops
// the migration before it starts, which libvirt would refuse.
func (d *Driver) arrivedHere(api API, uid string) (bool, error) {
	dom, _, err := d.lookup(api, uid, 0)
	var notOurs *NotOursError
	switch {
	case errors.As(err, &notOurs):
		return false, driver.Terminalf("node %s cannot receive the guest: %v", d.node, err)
	case driver.IsNotFound(err):
		return false, nil
	case err != nil:
		return false, err
	}
	state, _, err := api.DomainGetState(dom, 0)
	if isCode(err, golibvirt.ErrNoDomain) {
		return false, nil
	}
	if err != nil {
		return false, errors.Wrap(err, "cannot read domain state")
	}
	switch golibvirt.DomainState(state) {
	case golibvirt.DomainShutoff, golibvirt.DomainCrashed, golibvirt.DomainNostate:
		// A definition the migration replaces, left from the guest's
		// earlier stay here: it comes back, so nothing of it goes.
		d.migrateMu.Lock()
		if mg := d.migrations[uid]; mg != nil {
			mg.left = false
		}
		d.migrateMu.Unlock()
		return false, nil
	}
	return true, nil
}

// checkPools makes sure the storage pools of the guest's disks, seed and
// swap are on the node and active, and returns the volumes of its disks
// that are not there yet.
func (d *Driver) checkPools(api API, m driver.Machine) ([]poolVolume, error) {
	pools := []string{d.pool}
	for _, disk := range m.Disks {
		if p := cmp.Or(disk.Pool, d.pool); !slices.Contains(pools, p) {
			pools = append(pools, p)
		}
	}
	for _, name := range pools {
		p, err := api.StoragePoolLookupByName(name)
		if isCode(err, golibvirt.ErrNoStoragePool) {
			return nil, driver.Terminalf("storage pool %q, which the guest's disks need, does not exist on node %s", name, d.node)
		}
		if err != nil {
			return nil, errors.Wrapf(err, "cannot look up storage pool %s", name)
		}
		state, _, _, _, err := api.StoragePoolGetInfo(p)
		if err != nil {
			return nil, errors.Wrapf(err, "cannot read storage pool %s", name)
		}
		if golibvirt.StoragePoolState(state) != golibvirt.StoragePoolRunning {
			return nil, errors.Errorf("storage pool %q, which the guest's disks need, is not active on node %s", name, d.node)
		}
	}
	// A disk in a shared pool is there already: it must be found, never
	// copied over.
	if err := d.refreshDiskPools(api, m); err != nil {
		return nil, err
	}
	var absent []poolVolume
	for _, disk := range m.Disks {
		v := poolVolume{pool: cmp.Or(disk.Pool, d.pool), name: disk.Name}
		_, err := findVolume(api, v.pool, v.name)
		switch {
		case driver.IsNotFound(err):
			absent = append(absent, v)
		case err != nil:
			return nil, err
		}
	}
	return absent, nil
}

// readyNetworks makes the guest's networks ready for it, with the DHCP
// reservations of its MACs, and holds its interfaces until it is here or
// is deleted.
func (d *Driver) readyNetworks(api API, m driver.Machine, absent []poolVolume) error {
	held := nicsOf(m)
	d.networkMu.Lock()
	defer d.networkMu.Unlock()
	d.migrateMu.Lock()
	in := d.incoming[m.UID]
	if in == nil {
		in = &incoming{}
		d.incoming[m.UID] = in
	}
	old := in.nics
	in.nics = held
	for _, v := range absent {
		if !slices.Contains(in.absent, v) {
			in.absent = append(in.absent, v)
		}
	}
	d.migrateMu.Unlock()
	d.hold(held, 1)
	d.hold(old, -1)
	return d.ensureEachNetwork(api, m, nil)
}

// readySeed writes the guest's cloud-init seed, unless the one written for
// the same Machine is there.
func (d *Driver) readySeed(api API, m driver.Machine) error {
	hash := specHash(m)
	d.migrateMu.Lock()
	written := d.incoming[m.UID] != nil && d.incoming[m.UID].seed == hash
	d.migrateMu.Unlock()
	if written {
		_, err := findVolume(api, d.pool, seedVolume(m.UID))
		if err == nil || !driver.IsNotFound(err) {
			return err
		}
	}
	iso, err := seedISO(m)
	if err != nil {
		return err
	}
	if err := writeSeed(api, d.pool, seedVolume(m.UID), iso, d.testDriver); err != nil {
		return err
	}
	d.migrateMu.Lock()
	if in := d.incoming[m.UID]; in != nil {
		in.seed = hash
	}
	d.migrateMu.Unlock()
	return nil
}

// arrived stops holding the interfaces of a guest readied for a migration:
// its domain is here and holds them.
func (d *Driver) arrived(uid string) {
	d.migrateMu.Lock()
	_, ok := d.incoming[uid]
	d.migrateMu.Unlock()
	if ok {
		d.releaseIncoming(uid)
	}
}

// releaseIncoming forgets the guest readied for a migration to this node,
// if there is one, and returns its interfaces, which are no longer held.
func (d *Driver) releaseIncoming(uid string) []nic {
	d.networkMu.Lock()
	defer d.networkMu.Unlock()
	d.migrateMu.Lock()
	in := d.incoming[uid]
	delete(d.incoming, uid)
	d.migrateMu.Unlock()
	if in == nil {
		return nil
	}
	d.hold(in.nics, -1)
	return in.nics
}

// dropIncoming deletes, when the guest readied for a migration is not on
// the node (absent), the volumes of its disks a failed migration made
// here: only those that were not there when it was readied, and only
// while no domain has them attached.
func (d *Driver) dropIncoming(ctx context.Context, uid string, absent bool) error {
	d.migrateMu.Lock()
	var made []poolVolume
	if in := d.incoming[uid]; in != nil {
		made = slices.Clone(in.absent)
	}
	d.migrateMu.Unlock()
	if !absent {
		return nil
	}
	for _, v := range made {
		if err := d.DeleteVolume(ctx, driver.Disk{Name: v.name, Pool: v.pool}); err != nil && !driver.IsInUse(err) {
			return err
		}
	}
	return nil
}

// Migrate implements driver.Migrator.
func (d *Driver) Migrate(ctx context.Context, m driver.Machine, t driver.MigrationTarget) (driver.MigrationStatus, error) {
	if t.Cancel {
		return d.cancelMigration(ctx, m, t)
	}
	if mg := d.migrationOf(m.UID, t.ID); mg != nil && !d.leftBehind(mg) {
		return d.progress(mg), nil
	}
	d.migrateStart.Lock()
	defer d.migrateStart.Unlock()
	if mg := d.migrationOf(m.UID, t.ID); mg != nil {
		if d.leftBehind(mg) {
			d.finish(ctx, m.UID, mg)
		}
		return d.progress(mg), nil
	}
	if t.ID == "" {
		return driver.MigrationStatus{}, driver.Terminalf("a migration needs an ID")
	}
	host, err := migrationHost(t.URI)
	if err != nil {
		return driver.MigrationStatus{}, err
	}
	if err := validate(m); err != nil {
		return driver.MigrationStatus{}, err
	}
	if err := movable(m); err != nil {
		return driver.MigrationStatus{}, err
	}
	if phase, node := d.outgoing(m.UID); phase == driver.MigrationRunning {
		return driver.MigrationStatus{}, errors.Errorf("another migration of guest %s, to node %s, is still running", m.UID, node)
	}

	api, _, err := d.api()
	if err != nil {
		return driver.MigrationStatus{}, err
	}
	dom, live, err := d.lookup(api, m.UID, 0)
	if err != nil {
		return driver.MigrationStatus{}, err
	}
	switch {
	case live.owner.Imported:
		return driver.MigrationStatus{}, driver.Terminalf("guest %s is a domain virtfleet did not make (%s): it cannot move live", m.UID, dom.Name)
	case formatUUID(dom.UUID) != m.UID:
		return driver.MigrationStatus{}, driver.Terminalf("guest %s runs as domain %s, which was made for another VM (%s) whose name its devices carry: it cannot move live", m.UID, dom.Name, formatUUID(dom.UUID))
	}
	state, reason, err := api.DomainGetState(dom, 0)
	if err != nil {
		return driver.MigrationStatus{}, errors.Wrap(err, "cannot read domain state")
	}
	mg := &migration{
		status: driver.MigrationStatus{ID: t.ID, Phase: driver.MigrationRunning, StartedAt: d.now()},
		node:   cmp.Or(t.Node, host),
		dom:    dom,
		copied: copiedDisks(m, live.volumes, d.pool),
	}
	switch s := golibvirt.DomainState(state); {
	case movedAway(s, reason):
		// A migration this process does not remember (the agent restarted
		// while it ran) moved the guest away: the one asked about, as far
		// as the node can tell. What it left here goes now.
		mg.moved, mg.left = true, true
		mg.status.Message = "the guest left node " + d.node + " by live migration"
		d.remember(m.UID, mg)
		d.finish(ctx, m.UID, mg)
		return d.progress(mg), nil
	case s != golibvirt.DomainRunning && s != golibvirt.DomainBlocked && !migrating(s, reason):
		// One paused for a switch-over is moving already, by a migration
		// this process does not remember: it goes on below, libvirt
		// refuses the second migration, and how the first ended decides
		// (outcome).
		phase, _ := phaseOf(s, reason)
		return driver.MigrationStatus{}, driver.Terminalf("guest %s is %s: only a running guest moves live", m.UID, strings.ToLower(string(phase)))
	}
	next, err := d.describe(api, dom, m.UID, golibvirt.DomainXMLInactive)
	if err != nil {
		return driver.MigrationStatus{}, err
	}
	if !sameVolumes(live.volumes, next.volumes) {
		return driver.MigrationStatus{}, driver.Terminalf("guest %s runs with other disks than its definition has, which take effect at its next start: restart it before it moves live", m.UID)
	}
	if err := d.carryRestarts(api, dom, m.UID, *next.owner, live.owner.SpecHash); err != nil {
		return driver.MigrationStatus{}, err
	}
	mg.status.Message = "moving to node " + mg.node
	d.remember(m.UID, mg)
	d.loops.Add(1)
	go d.run(mg, m.UID, t.URI, migrationParams(host))
	return d.progress(mg), nil
}

// cancelMigration aborts the migration t names if it still copies; libvirt then
// fails it (run records how) and the guest runs on here. One that is over
// stays as it ended, and one that never started never will.
func (d *Driver) cancelMigration(ctx context.Context, m driver.Machine, t driver.MigrationTarget) (driver.MigrationStatus, error) {
	mg := d.migrationOf(m.UID, t.ID)
	if mg == nil {
		if _, err := d.Observe(ctx, m.UID); err != nil {
			return driver.MigrationStatus{}, err
		}
		return driver.MigrationStatus{ID: t.ID, Phase: driver.MigrationFailed, FinishedAt: d.now(),
			Message: "cancelled before it started; the guest runs on node " + d.node}, nil
	}
	if d.leftBehind(mg) {
		d.migrateStart.Lock()
		d.finish(ctx, m.UID, mg)
		d.migrateStart.Unlock()
	}
	d.migrateMu.Lock()
	copying := mg.status.Phase == driver.MigrationRunning && !mg.moved
	d.migrateMu.Unlock()
	if copying {
		api, _, err := d.api()
		if err != nil {
			return driver.MigrationStatus{}, err
		}
		// No job left (it just ended) is no error: run records the end.
		if err := api.DomainAbortJob(mg.dom); err != nil && !isCode(err, golibvirt.ErrOperationInvalid, golibvirt.ErrNoDomain) {
			return driver.MigrationStatus{}, errors.Wrap(err, "cannot abort the migration")
		}
	}
	return d.progress(mg), nil
}

// migrationOf is the guest's migration with the given ID, if it is the
// last one the driver started.
func (d *Driver) migrationOf(uid, id string) *migration {
	d.migrateMu.Lock()
	defer d.migrateMu.Unlock()
	if mg := d.migrations[uid]; mg != nil && mg.status.ID == id {
		return mg
	}
	return nil
}

// remember keeps mg as the guest's last migration, in place of the one
// before.
func (d *Driver) remember(uid string, mg *migration) {
	d.migrateMu.Lock()
	defer d.migrateMu.Unlock()
	d.migrations[uid] = mg
}

// leftBehind says whether mg moved its guest away and what the guest left
// on this node is not all gone.
func (d *Driver) leftBehind(mg *migration) bool {
	d.migrateMu.Lock()
	defer d.migrateMu.Unlock()
	return mg.status.Phase == driver.MigrationSucceeded && mg.left
}

// outgoing is the phase of a migration of the guest from this node that
// still concerns it: Running while it runs, Succeeded while what it left
// here is not all gone; empty otherwise. node is the target.
func (d *Driver) outgoing(uid string) (phase driver.MigrationPhase, node string) {
	d.migrateMu.Lock()
	defer d.migrateMu.Unlock()
	mg := d.migrations[uid]
	switch {
	case mg == nil:
	case mg.status.Phase == driver.MigrationRunning:
		return driver.MigrationRunning, mg.node
	case mg.status.Phase == driver.MigrationSucceeded && mg.left:
		return driver.MigrationSucceeded, mg.node
	}
	return "", ""
}

// migratingPhase is the phase of a guest libvirt paused for the
// switch-over of a live migration: it runs on, from here or on arrival.
func (d *Driver) migratingPhase(uid string) (driver.Phase, string) {
	if phase, node := d.outgoing(uid); phase == driver.MigrationRunning {
		return driver.PhaseRunning, "moving to node " + node + " by live migration"
	}
	return driver.PhaseStarting, "arriving by live migration"
}

// progress is the migration's status, with the progress libvirt reports
// while it runs.
func (d *Driver) progress(mg *migration) driver.MigrationStatus {
	d.migrateMu.Lock()
	st, copying := mg.status, !mg.moved
	d.migrateMu.Unlock()
	if st.Phase != driver.MigrationRunning || !copying {
		return st
	}
	api, _, err := d.api()
	if err != nil {
		return st
	}
	typ, params, err := api.DomainGetJobStats(mg.dom, 0)
	if err != nil || golibvirt.DomainJobType(typ) == golibvirt.DomainJobNone {
		return st // not started yet, or just over
	}
	total, processed := paramBytes(params, jobDataTotal), paramBytes(params, jobDataProcessed)
	if total == 0 {
		return st // started, with nothing counted yet
	}
	d.migrateMu.Lock()
	defer d.migrateMu.Unlock()
	if mg.status.Phase == driver.MigrationRunning && !mg.moved {
		mg.status.TotalBytes, mg.status.ProcessedBytes = total, processed
		mg.status.Message = fmt.Sprintf("moving to node %s: %d of %d MiB of memory and disks copied", mg.node, processed>>20, total>>20)
	}
	return mg.status
}

// run carries the migration out and records how it ended. It is one of
// the driver's loops.
func (d *Driver) run(mg *migration, uid, uri string, params []golibvirt.TypedParam) {
	defer d.loops.Done()
	err := d.perform(mg.dom, uri, params)
	finished := d.now()
	moved, werr := d.outcome(mg.dom, err)
	if werr != nil {
		return // the driver is closed: the record goes with it
	}
	if !moved {
		d.migrateMu.Lock()
		mg.status.Phase, mg.status.FinishedAt = driver.MigrationFailed, finished
		mg.status.Message = fmt.Sprintf("live migration to node %s failed, and the guest runs on node %s as before: %v", mg.node, d.node, err)
		d.migrateMu.Unlock()
		return
	}
	total, processed, downtime := d.completedStats(mg.dom)
	d.migrateMu.Lock()
	mg.moved, mg.left = true, true
	mg.status.FinishedAt = finished
	mg.status.TotalBytes, mg.status.ProcessedBytes, mg.status.Downtime = total, processed, downtime
	mg.status.Message = "the guest runs on node " + mg.node + "; removing what it left on node " + d.node
	d.migrateMu.Unlock()
	d.migrateStart.Lock()
	defer d.migrateStart.Unlock()
	d.finish(d.ctx, uid, mg)
}

// perform runs the migration on a connection of its own: the call lasts
// as long as the migration and holds none of the shared connection's
// requests. Closing the driver closes it.
func (d *Driver) perform(dom golibvirt.Domain, uri string, params []golibvirt.TypedParam) error {
	l, err := d.dial()
	if err != nil {
		return err
	}
	api := d.through(l)
	stop := context.AfterFunc(d.ctx, func() { _ = l.Disconnect() })
	defer func() {
		if stop() {
			_ = l.Disconnect()
		}
	}()
	_, err = api.DomainMigratePerform3Params(dom, golibvirt.OptString{uri}, params, nil, migrateFlags)
	return err
}

// outcome says whether the guest left the node. libvirt says so when the
// migration call succeeds. When it fails, the domain does, once no job of
// it runs (a connection lost mid-call does not end the migration in
// libvirtd): shut off as migrated, or here still. The error is the
// driver's closing while it waits.
func (d *Driver) outcome(dom golibvirt.Domain, err error) (bool, error) {
	if err == nil {
		return true, nil
	}
	var moved bool
	werr := wait.PollUntilContextCancel(d.ctx, time.Second, true, func(context.Context) (bool, error) {
		api, _, err := d.api()
		if err != nil {
			return false, nil
		}
		typ, _, err := api.DomainGetJobStats(dom, 0)
		if err == nil && golibvirt.DomainJobType(typ) != golibvirt.DomainJobNone {
			return false, nil
		}
		state, reason, err := api.DomainGetState(dom, 0)
		switch {
		case isCode(err, golibvirt.ErrNoDomain):
			return true, nil // deleted while it moved
		case err != nil:
			return false, nil
		}
		moved = movedAway(golibvirt.DomainState(state), reason)
		return true, nil
	})
	return moved, werr
}

// completedStats are what libvirt tells of the migration once it is over:
// what it transferred and how long the guest was paused for the
// switch-over; zero what it does not tell.
func (d *Driver) completedStats(dom golibvirt.Domain) (total, processed int64, downtime time.Duration) {
	api, _, err := d.api()
	if err != nil {
		return 0, 0, 0
	}
	_, params, err := api.DomainGetJobStats(dom, golibvirt.DomainJobStatsCompleted)
	if err != nil {
		return 0, 0, 0
	}
	return paramBytes(params, jobDataTotal), paramBytes(params, jobDataProcessed), time.Duration(paramBytes(params, jobDowntime)) * time.Millisecond
}

// finish removes what a guest that moved away left on this node and marks
// its migration Succeeded. What cannot be removed yet is named in the
// status's message and tried again at the migration's next Migrate. The
// caller holds migrateStart.
func (d *Driver) finish(ctx context.Context, uid string, mg *migration) {
	err := d.leave(ctx, uid, mg.copied)
	d.migrateMu.Lock()
	defer d.migrateMu.Unlock()
	mg.status.Phase = driver.MigrationSucceeded
	if mg.status.FinishedAt.IsZero() {
		mg.status.FinishedAt = d.now()
	}
	if err != nil {
		mg.status.Message = fmt.Sprintf("the guest runs on node %s; what it left on node %s is not all removed yet: %v", mg.node, d.node, err)
		return
	}
	mg.left = false
	mg.status.Message = "the guest runs on node " + mg.node
}

// leave removes what the guest left on this node once it runs on another:
// its domain, seed and swap, its reservations and the networks no other
// guest uses (all of which Delete removes), and the copies of its disks
// the migration made elsewhere. A domain of the guest that is not one
// that moved away (the guest came back) is the guest's, and stays.
func (d *Driver) leave(ctx context.Context, uid string, copied []poolVolume) error {
	api, _, err := d.api()
	if err != nil {
		return err
	}
	dom, err := d.domainOf(api, uid)
	switch {
	case driver.IsNotFound(err):
	case err != nil:
		return err
	default:
		state, reason, err := api.DomainGetState(dom, 0)
		if err != nil && !isCode(err, golibvirt.ErrNoDomain) {
			return errors.Wrap(err, "cannot read domain state")
		}
		if err == nil && !movedAway(golibvirt.DomainState(state), reason) {
			return nil
		}
	}
	if err := d.Delete(ctx, uid); err != nil {
		return err
	}
	for _, v := range copied {
		if err := d.DeleteVolume(ctx, driver.Disk{Name: v.name, Pool: v.pool}); err != nil {
			return err
		}
	}
	return nil
}

// carryRestarts writes the reboots and crashes seen of the guest and not
// in its metadata yet into it, in its next and its running definition: the
// metadata goes with the domain, and the target's driver counts on from
// it.
func (d *Driver) carryRestarts(api API, dom golibvirt.Domain, uid string, owner ownership, liveHash string) error {
	d.stateMu.Lock()
	reboots, crashes := d.reboots[uid], d.crashes[uid]
	d.stateMu.Unlock()
	if reboots+crashes == 0 {
		return nil
	}
	next := owner
	next.Restarts += reboots + crashes
	if err := d.saveOwnership(api, dom, owner, next, liveHash, true); err != nil {
		return err
	}
	d.recordedReboots(uid, reboots)
	d.stateMu.Lock()
	if d.crashes[uid] -= crashes; d.crashes[uid] <= 0 {
		delete(d.crashes, uid)
	}
	d.stateMu.Unlock()
	return nil
}

// movable refuses a Machine whose disks cannot all be copied to another
// node.
func movable(m driver.Machine) error {
	for _, disk := range m.Disks {
		if disk.Imported {
			return driver.Terminalf("disk %q is an imported volume: an imported volume cannot be copied to another node, so the guest cannot move live", disk.Name)
		}
	}
	return nil
}

// copiedDisks are the volumes of m's disks the running guest has, which
// the migration copies.
func copiedDisks(m driver.Machine, attached []poolVolume, pool string) []poolVolume {
	var out []poolVolume
	for _, disk := range m.Disks {
		if v := (poolVolume{pool: cmp.Or(disk.Pool, pool), name: disk.Name}); slices.Contains(attached, v) {
			out = append(out, v)
		}
	}
	return out
}

// sameVolumes says whether a and b hold the same volumes, in any order.
func sameVolumes(a, b []poolVolume) bool {
	key := func(v poolVolume) string { return v.pool + "/" + v.name }
	as, bs := make([]string, len(a)), make([]string, len(b))
	for i, v := range a {
		as[i] = key(v)
	}
	for i, v := range b {
		bs[i] = key(v)
	}
	slices.Sort(as)
	slices.Sort(bs)
	return slices.Equal(slices.Compact(as), slices.Compact(bs))
}

// migrationHost is the host of the target's URI, where the guest's memory
// and disks go.
func migrationHost(uri string) (string, error) {
	u, err := url.Parse(uri)
	if err != nil || u.Hostname() == "" {
		return "", driver.Terminalf("the target's URI %q names no host to migrate to", uri)
	}
	return u.Hostname(), nil
}

// migrationParams send the guest's memory and disks to host, the target's
// URI's: without migrate_uri the target would give its own hostname,
// which need not lead to it. A target given by address listens there
// only; one given by name listens where its configuration says.
func migrationParams(host string) []golibvirt.TypedParam {
	addr := host
	if strings.Contains(host, ":") {
		addr = "[" + host + "]"
	}
	params := []golibvirt.TypedParam{{Field: paramMigrateURI, Value: *golibvirt.NewTypedParamValueString("tcp://" + addr)}}
	if _, err := netip.ParseAddr(host); err == nil {
		params = append(params, golibvirt.TypedParam{Field: paramListenAddress, Value: *golibvirt.NewTypedParamValueString(host)})
	}
	return params
}

// paramBytes is the integer field of a job's statistics, 0 when absent.
func paramBytes(params []golibvirt.TypedParam, field string) int64 {
	for _, p := range params {
		if p.Field != field {
			continue
		}
		switch v := p.Value.I.(type) {
		case uint64:
			return int64(min(v, math.MaxInt64))
		case int64:
			return v
		case uint32:
			return int64(v)
		case int32:
			return int64(v)
		}
	}
	return 0
}

// movedAway says whether a domain in this state is what a live migration
// left of a guest that now runs on another node.
func movedAway(s golibvirt.DomainState, reason int32) bool {
	return s == golibvirt.DomainShutoff && golibvirt.DomainShutoffReason(reason) == golibvirt.DomainShutoffMigrated
}

// migrating says whether libvirt paused the guest for the switch-over of a
// live migration, on its source or on its target.
func migrating(s golibvirt.DomainState, reason int32) bool {
	return s == golibvirt.DomainPaused && golibvirt.DomainPausedReason(reason) == golibvirt.DomainPausedMigration
}
