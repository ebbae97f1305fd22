package virtualmachine

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/backuplocation"
	"github.com/virtfleet/virtfleet/hub/internal/controller/virtualnetwork"
	"github.com/virtfleet/virtfleet/hub/internal/fleet"
	"github.com/virtfleet/virtfleet/hub/internal/ipam"
	"github.com/virtfleet/virtfleet/hub/internal/placement"
)

// MissingError names the Volumes and VirtualNetworks a VirtualMachine waits
// for. The VM stays Pending and is reconciled again as soon as one of them
// is created.
type MissingError struct {
	Namespace string
	Volumes   []string
	Networks  []string
	Images    []string
}

func (e *MissingError) Error() string {
	var parts []string
	if len(e.Volumes) > 0 {
		parts = append(parts, fmt.Sprintf("Volume %s", strings.Join(e.Volumes, ", ")))
	}
	if len(e.Networks) > 0 {
		parts = append(parts, fmt.Sprintf("VirtualNetwork %s", strings.Join(e.Networks, ", ")))
	}
	if len(e.Images) > 0 {
		parts = append(parts, fmt.Sprintf("DiskImage %s", strings.Join(e.Images, ", ")))
	}
	return fmt.Sprintf("waiting for %s in namespace %s: create them and the VM goes on by itself", strings.Join(parts, " and "), e.Namespace)
}

// SourceWaitError says why a VM waits for what the cloned DiskImages of
// its new disks copy (resolveSources): a source on no node yet, a snapshot
// not ready, or an image whose source is gone that no node holds. It is a
// wait, counted as one, not a failure: the VM goes on by itself.
type SourceWaitError struct {
	Reasons []string
	// Unheld are the uids of the images whose source is gone and that no
	// node holds: a node's report that it holds one may let the VM go on
	// (Scheduler.RetryImage).
	Unheld []string
}

func (e *SourceWaitError) Error() string { return strings.Join(e.Reasons, "; ") }

// dependencies are the resolved Volumes and VirtualNetworks of a VM.
type dependencies struct {
	volumes  []v1alpha1.Volume         // in diskAttachments order
	networks []v1alpha1.VirtualNetwork // in virtualNetworks order
	images   map[string]*v1alpha1.DiskImage
	// sources are the Volumes the cloned images among images copy, by
	// image name; each is bound to a node.
	sources map[string]*v1alpha1.Volume
	// heldOnly are the nodes holding each cloned image among images whose
	// source is gone, by image name, for a VM on no node with a Volume of
	// it on no node: only those nodes can make that Volume's disk
	// (needSource).
	heldOnly map[string][]string
	// snapshots are the uids of the VirtualMachineSnapshots the images
	// among sources copy their Volume as it was in (source.snapshotRef),
	// by image name; each is ReadyToUse and holds its image's Volume.
	snapshots map[string]string
	// backups are the backups the images made from one are read from, with
	// their locations' credentials, by image name (resolveBackups).
	backups map[string]wire.ImageBackup
	// imageSources are the addresses outside the public internet the
	// namespace's images may be downloaded from (admit sets them).
	imageSources []string
	// addresses are the VM's addresses on the networks whose addresses are
	// the hub's (ipam.Addressed), by network name.
	addresses map[string]netip.Prefix
	// overlay is set when the VM's node has a tunnel address: the networks
	// spanning nodes are joined to the overlay there by their VNIs.
	overlay bool
	// sizes are the sizes in effect of the Volumes whose spec asks for
	// more (sizeVolumes), by uid; the others are sent at their spec's.
	sizes map[types.UID]int64
	// grows are the sizes to record before the next publish, by uid: the
	// growths the namespace's quota admits, and the sizes of Volumes
	// without a record yet.
	grows map[types.UID]int64
	// heldGrowth says why each Volume past the quota keeps its size.
	heldGrowth []string
	// attached are the Volumes on no node given to the VM after its
	// placement, by uid: admitted as they are bound (bindVolumes).
	attached map[types.UID]bool
}

// sizeOf is the size v's node is sent: its size in effect.
func (d dependencies) sizeOf(v *v1alpha1.Volume) int64 {
	if size, ok := d.sizes[v.UID]; ok {
		return size
	}
	return v.Spec.ForProvider.Size.Value()
}

// boundNode is the node the VM's node-local volumes are bound to, if any, or
// an error when they are bound to different nodes (no node has them all). A
// Volume made from a cloned DiskImage binds the VM to the node of the
// image's source Volume too: only that node has what the image copies.
func (d dependencies) boundNode() (string, error) {
	node, from := "", ""
	for _, name := range slices.Sorted(maps.Keys(d.sources)) {
		src := d.sources[name]
		n := src.GetAnnotations()[v1alpha1.AnnotationNode]
		what := fmt.Sprintf("DiskImage %s clones Volume %s, which is on %s", name, src.Name, n)
		switch {
		case node == "":
			node, from = n, what
		case n != node:
			return "", errors.Errorf("%s, but %s; a cloned image can only be made on its source's node and a VM runs on one node", from, what)
		}
	}
	for _, v := range d.volumes {
		n := v.GetAnnotations()[v1alpha1.AnnotationNode]
		switch {
		case n == "":
		case node == "":
			node, from = n, v.Name
		case n != node && len(d.sources) > 0:
			return "", errors.Errorf("%s, but Volume %s is on %s; a cloned image can only be made on its source's node and a VM can only use volumes of one node", from, v.Name, n)
		case n != node:
			return "", errors.Errorf("volumes %s (on %s) and %s (on %s) live on different nodes; a VM can only use volumes of one node", from, node, v.Name, n)
		}
	}
	return node, nil
}

// volumesOn names the VM's Volumes bound to node, in diskAttachments
// order.
func (d dependencies) volumesOn(node string) []string {
	var out []string
	for _, v := range d.volumes {
		if v.GetAnnotations()[v1alpha1.AnnotationNode] == node {
			out = append(out, v.Name)
		}
	}
	return out
}

// pools are the shared storage pools of the VM's Volumes, sorted, each
// once: a node must reach all of them to open its disks.
func (d dependencies) pools() []string {
	var out []string
	for _, v := range d.volumes {
		if p := v.Spec.ForProvider.StoragePool; p != "" && !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return out
}

// nodeLocal is the first of the VM's Volumes on its node's own storage
// (no storagePool), if any: a VM with one cannot run on another node.
func (d dependencies) nodeLocal() (string, bool) {
	for _, v := range d.volumes {
		if v.Spec.ForProvider.StoragePool == "" {
			return v.Name, true
		}
	}
	return "", false
}

// fences is whether the VM's node is asked to destroy the guest when it
// loses its lease (wire.Intent.Fence): only a VM the hub would restart on
// another node, one with availability Restart whose guest is virtfleet's
// to make (neither imported nor only observed) and whose disks all live in
// shared pools. Fencing any other guest would stop it for nothing.
func fences(vm *v1alpha1.VirtualMachine, d dependencies) bool {
	_, local := d.nodeLocal()
	return vm.Spec.ForProvider.RestartsElsewhere() && !ObserveOnly(vm) && meta.GetExternalName(vm) == "" &&
		len(d.volumes) > 0 && !local
}

// attachable says why a VM cannot attach the Volume v, which imports a
// volume of its node, yet or at all: a guest writes to its disks, so the
// Volume must let virtfleet change the volume (not Observe only), and the
// node must have reported the import as this Volume's (Running, with the
// volume's real size), not as another Volume's.
func attachable(v *v1alpha1.Volume) error {
	ext, node := meta.GetExternalName(v), v.GetAnnotations()[v1alpha1.AnnotationNode]
	if ObserveOnly(v) {
		return errors.Errorf("Volume %s only observes volume %s of node %s (its managementPolicies allow neither Create nor Update); a VirtualMachine attaches an imported Volume only when virtfleet may change the volume", v.Name, ext, node)
	}
	if v.Status.AtProvider.Phase != v1alpha1.PhaseRunning || v.Status.AtProvider.Capacity == nil {
		err := errors.Errorf("Volume %s has not imported volume %s of node %s yet", v.Name, ext, node)
		if why := v.GetCondition(xpv2.TypeReady).Message; why != "" {
			err = errors.Wrap(errors.New(why), err.Error())
		}
		return err
	}
	return nil
}

// holders are the nodes that hold the DiskImage of uid, Ready to make
// disks of, sorted: their own reports of it, never the DiskImage's status,
// which falls back to what VMs say where a node reports no images (nova
// makes a clone's disk straight from a Cinder snapshot and keeps no copy).
// Nil: no node is known to hold any.
type holders func(uid string) []string

// heldIn is holders as the nodes' image reports in images say.
func heldIn(images *fleet.Reports[wire.ImageReport]) holders {
	return func(uid string) []string {
		var nodes []string
		for _, rep := range images.All(uid) {
			if rep.Report.Phase == wire.ImagePhaseReady {
				nodes = append(nodes, rep.Node)
			}
		}
		return nodes
	}
}

// holds says whether node holds the DiskImage of uid as held says.
func (held holders) holds(node, uid string) bool {
	return held != nil && slices.Contains(held(uid), node)
}

// resolve reads what the VM refers to from the manager's cache; held says
// which nodes hold which images (resolveSources).
func resolve(ctx context.Context, kube client.Reader, vm *v1alpha1.VirtualMachine, held holders) (dependencies, error) {
	var d dependencies
	missing := &MissingError{Namespace: vm.Namespace}
	for _, a := range vm.Spec.ForProvider.DiskAttachments {
		v := v1alpha1.Volume{}
		err := kube.Get(ctx, types.NamespacedName{Namespace: vm.Namespace, Name: string(a.Name)}, &v)
		switch {
		case kerrors.IsNotFound(err) || (err == nil && v.DeletionTimestamp != nil):
			missing.Volumes = append(missing.Volumes, string(a.Name))
		case err != nil:
			return d, errors.Wrapf(err, "cannot get Volume %s", a.Name)
		case meta.GetExternalName(&v) != "":
			if err := attachable(&v); err != nil {
				return d, err
			}
		}
		d.volumes = append(d.volumes, v)
	}
	for _, n := range vm.Spec.ForProvider.VirtualNetworks {
		vn := v1alpha1.VirtualNetwork{}
		err := kube.Get(ctx, types.NamespacedName{Namespace: vm.Namespace, Name: string(n)}, &vn)
		switch {
		case kerrors.IsNotFound(err) || (err == nil && vn.DeletionTimestamp != nil):
			missing.Networks = append(missing.Networks, string(n))
		case err != nil:
			return d, errors.Wrapf(err, "cannot get VirtualNetwork %s", n)
		}
		d.networks = append(d.networks, vn)
	}
	for _, v := range d.volumes {
		src := v.Spec.ForProvider.Source
		if src == nil || src.DiskImageRef == nil {
			continue
		}
		name := string(src.DiskImageRef.Name)
		if _, seen := d.images[name]; seen || slices.Contains(missing.Images, name) {
			continue
		}
		img := &v1alpha1.DiskImage{}
		err := kube.Get(ctx, types.NamespacedName{Namespace: vm.Namespace, Name: name}, img)
		switch {
		case kerrors.IsNotFound(err) || (err == nil && img.DeletionTimestamp != nil):
			missing.Images = append(missing.Images, name)
			continue
		case err != nil:
			return d, errors.Wrapf(err, "cannot get DiskImage %s", name)
		}
		if d.images == nil {
			d.images = map[string]*v1alpha1.DiskImage{}
		}
		d.images[name] = img
	}
	if len(missing.Volumes)+len(missing.Networks)+len(missing.Images) > 0 {
		return d, missing
	}
	if err := virtualnetwork.CheckOverlaps(ctx, kube, d.networks...); err != nil {
		return d, err
	}
	return d, d.resolveSources(ctx, kube, vm, held)
}

// resolveSources reads the source Volume of each cloned image. The VM waits
// while a source is on no node: until a VM using it is placed, no node has
// what the image copies. A source is needed only by the VM's Volumes of the
// image whose disks are not made yet (needSource): once the source is gone,
// being deleted or no longer holds its snapshot, the image is sent Held,
// and the VM waits only while one of those disks is on a node that does
// not hold the image. One still there is read all the same, so the node is
// told what the image was made of for as long as the hub knows it.
func (d *dependencies) resolveSources(ctx context.Context, kube client.Reader, vm *v1alpha1.VirtualMachine, held holders) error {
	wait := &SourceWaitError{}
	for _, name := range slices.Sorted(maps.Keys(d.images)) {
		img := d.images[name]
		ref := img.Spec.ForProvider.Source.VolumeRef
		if ref == nil {
			continue
		}
		src := &v1alpha1.Volume{}
		err := kube.Get(ctx, types.NamespacedName{Namespace: img.Namespace, Name: string(ref.Name)}, src)
		var why string
		switch {
		case kerrors.IsNotFound(err):
			why = fmt.Sprintf("DiskImage %s clones Volume %s, which does not exist", name, ref.Name)
		case err != nil:
			return errors.Wrapf(err, "cannot get Volume %s, the source of DiskImage %s", ref.Name, name)
		case src.DeletionTimestamp != nil:
			why = fmt.Sprintf("DiskImage %s clones Volume %s, which is being deleted", name, ref.Name)
		case src.GetAnnotations()[v1alpha1.AnnotationNode] == "":
			why = fmt.Sprintf("DiskImage %s clones Volume %s, which is on no node yet; the VM waits until a VM using %s is placed", name, ref.Name, ref.Name)
		case img.Spec.ForProvider.Source.SnapshotRef != nil:
			var uid string
			if uid, why, err = snapshotOf(ctx, kube, img, src); err != nil {
				return err
			}
			if why == "" {
				if d.snapshots == nil {
					d.snapshots = map[string]string{}
				}
				d.snapshots[name] = uid
			}
		}
		if why == "" {
			if d.sources == nil {
				d.sources = map[string]*v1alpha1.Volume{}
			}
			d.sources[name] = src
			continue
		}
		if needs, unheld, notes := d.needSource(vm, img, held); needs {
			wait.Reasons = append(wait.Reasons, strings.Join(append([]string{why}, notes...), "; "))
			if unheld {
				wait.Unheld = append(wait.Unheld, string(img.UID))
			}
		}
	}
	if len(wait.Reasons) > 0 {
		return wait
	}
	return nil
}

// needSource says whether one of the VM's Volumes made from the cloned
// image img needs img's source: its disk is not made, and its node does
// not hold img to make it of; notes say so of each such Volume, and unheld
// whether one of them is on no node, which a holder of img would end. A disk is
// made when the node's report of the VM lists it (status.atProvider.disks:
// the guest is defined with it, so the node made it), from the node the
// Volume is bound to. That the image is Ready on the node is not that
// record: another VM's new Volume of the image is on the same node and has
// no disk yet. A Volume on no node goes where its VM is, and where neither
// is on a node yet, placement puts the VM on a node that holds img
// (heldOnly): it needs the source only when no node holds img.
//
// No holder is a wait, not a Terminal error, though the source is gone:
// a holder may yet report (a node lost and back, an agent or hub
// restarted and reading its reports again), and the user may create the
// source again. A Crossplane managed resource whose reference does not
// resolve, or a KubeVirt DataVolume whose clone source is missing, waits
// the same way, saying for what, and goes on by itself.
func (d *dependencies) needSource(vm *v1alpha1.VirtualMachine, img *v1alpha1.DiskImage, held holders) (needs, unheld bool, notes []string) {
	vmNode := vm.GetAnnotations()[v1alpha1.AnnotationNode]
	for _, v := range d.volumes {
		src := v.Spec.ForProvider.Source
		if src == nil || src.DiskImageRef == nil || string(src.DiskImageRef.Name) != img.Name {
			continue
		}
		node := cmp.Or(v.GetAnnotations()[v1alpha1.AnnotationNode], vmNode)
		switch {
		case node == "" && held != nil && len(held(string(img.UID))) > 0:
			if d.heldOnly == nil {
				d.heldOnly = map[string][]string{}
			}
			d.heldOnly[img.Name] = held(string(img.UID))
		case node == "":
			// A first clone waits for its source alone (why says it);
			// one of an image made before waits for a node that made it.
			needs, unheld = true, true
			if made := img.Status.AtProvider.Nodes; len(made) > 0 {
				notes = append(notes, fmt.Sprintf("Volume %s is not made yet and no node holds DiskImage %s to make it of: the VM waits for %s, where it was made, to report it", v.Name, img.Name, strings.Join(made, ", ")))
			}
		case node == vmNode && slices.Contains(vm.Status.AtProvider.Disks, v.Name):
		case held.holds(node, string(img.UID)):
		default:
			needs = true
			notes = append(notes, fmt.Sprintf("Volume %s is not made yet and its node %s does not hold DiskImage %s to make it of", v.Name, node, img.Name))
		}
	}
	return needs, unheld, notes
}

// heldImages are what placement needs of heldOnly, by image name.
func (d dependencies) heldImages() []placement.HeldImage {
	var out []placement.HeldImage
	for _, name := range slices.Sorted(maps.Keys(d.heldOnly)) {
		out = append(out, placement.HeldImage{Name: name, Nodes: d.heldOnly[name]})
	}
	return out
}

// snapshotOf reads the VirtualMachineSnapshot img copies its source
// Volume src as it was in, in img's namespace only, and returns its uid,
// which names it on the node; or why the VM waits for it.
func snapshotOf(ctx context.Context, kube client.Reader, img *v1alpha1.DiskImage, src *v1alpha1.Volume) (uid, why string, err error) {
	name := string(img.Spec.ForProvider.Source.SnapshotRef.Name)
	s := &v1alpha1.VirtualMachineSnapshot{}
	err = kube.Get(ctx, types.NamespacedName{Namespace: img.Namespace, Name: name}, s)
	switch {
	case kerrors.IsNotFound(err):
		return "", fmt.Sprintf("DiskImage %s copies VirtualMachineSnapshot %s, which does not exist", img.Name, name), nil
	case err != nil:
		return "", "", errors.Wrapf(err, "cannot get VirtualMachineSnapshot %s, the source of DiskImage %s", name, img.Name)
	case !s.Serves(img):
		// An image made before the deletion holds it until made.
		return "", fmt.Sprintf("DiskImage %s copies VirtualMachineSnapshot %s, which is being deleted", img.Name, name), nil
	case !s.Status.ReadyToUse:
		return "", fmt.Sprintf("DiskImage %s copies VirtualMachineSnapshot %s, which is not ready to use (it is %s)", img.Name, name, cmp.Or(string(s.Status.Phase), "not taken yet")), nil
	case s.Status.VM == nil || !slices.ContainsFunc(s.Status.VM.DiskAttachments, func(a v1alpha1.DiskAttachment) bool { return string(a.Name) == src.Name }):
		return "", fmt.Sprintf("DiskImage %s copies Volume %s as it was in VirtualMachineSnapshot %s, which does not hold it: that snapshot is of VirtualMachine %s's disks", img.Name, src.Name, name, s.Spec.VMName), nil
	case s.Status.Node != src.GetAnnotations()[v1alpha1.AnnotationNode]:
		return "", fmt.Sprintf("DiskImage %s copies Volume %s, on node %s, as it was in VirtualMachineSnapshot %s, which is on node %s", img.Name, src.Name, src.GetAnnotations()[v1alpha1.AnnotationNode], name, s.Status.Node), nil
	}
	return string(s.UID), "", nil
}

// cloneUsersOf lists the VMs to wake when the Volume o changes because a
// DiskImage they are made from clones o: they wait for o to be bound to a
// node. DiskImages are few per namespace; the cache lists them cheaply.
func cloneUsersOf(ctx context.Context, kube client.Reader, o client.Object) []reconcile.Request {
	l := &v1alpha1.DiskImageList{}
	if err := kube.List(ctx, l, client.InNamespace(o.GetNamespace())); err != nil {
		return nil
	}
	var out []reconcile.Request
	for i := range l.Items {
		if ref := l.Items[i].Spec.ForProvider.Source.VolumeRef; ref != nil && string(ref.Name) == o.GetName() {
			out = append(out, imageUsersOf(ctx, kube, &l.Items[i])...)
		}
	}
	return out
}

// imageRef is the wire form of the image a volume is made from, if any.
func (d dependencies) imageRef(v v1alpha1.Volume) *wire.ImageRef {
	src := v.Spec.ForProvider.Source
	if src == nil || src.DiskImageRef == nil {
		return nil
	}
	img, ok := d.images[string(src.DiskImageRef.Name)]
	if !ok {
		return nil
	}
	fp := img.Spec.ForProvider
	ref := &wire.ImageRef{Name: img.Name, UID: string(img.UID), URL: fp.Source.URL, Checksum: fp.Source.SHA256, Format: string(v1alpha1.DiskFormatQCOW2)}
	if src, ok := d.sources[img.Name]; ok {
		ref.URL, ref.Checksum = "", ""
		ref.SourceVolume = &wire.SourceVolume{Name: src.Name, UID: string(src.UID)}
		if snap, ok := d.snapshots[img.Name]; ok {
			ref.SourceSnapshot = &wire.SourceSnapshot{Volume: *ref.SourceVolume, Snapshot: snap}
			ref.SourceVolume = nil
		}
	} else if fp.Source.VolumeRef != nil {
		// Its source is gone (resolveSources): the disk is made, or the
		// node holds the image. Still named, so that a disk missing
		// after all is made of the node's copy or fails, never empty.
		ref.URL, ref.Checksum, ref.Held = "", "", true
	}
	if ext := meta.GetExternalName(img); ext != "" && fp.Source.URL == "" && fp.Source.VolumeRef == nil {
		// An image of the node's backend, used as it is (admit checked
		// the namespace may import it).
		ref.ExternalName = ext
	}
	if fp.Format != nil {
		ref.Format = string(*fp.Format)
	}
	if fp.PruneAfter != nil {
		ref.PruneAfterSeconds = int64(fp.PruneAfter.Seconds())
	}
	if ref.URL != "" {
		ref.AllowedSources = d.imageSources
	}
	if b, ok := d.backups[img.Name]; ok {
		ref.URL, ref.Checksum, ref.Format = "", "", string(v1alpha1.DiskFormatRaw)
		ref.Backup = &b
	}
	return ref
}

// resolveBackups reads the location, with its credentials, of each image
// made from a backup. The VM waits while a location or its Secret is
// missing. It reads Secrets, so kube must not be a cache: only the VM's
// own reconcile, which builds its intent, calls it, never placement.
func (d *dependencies) resolveBackups(ctx context.Context, kube client.Reader) error {
	var waiting []string
	for _, name := range slices.Sorted(maps.Keys(d.images)) {
		img := d.images[name]
		b := img.Spec.ForProvider.Source.Backup
		if b == nil {
			continue
		}
		loc, why, err := backuplocation.Resolve(ctx, kube, b.Location)
		switch {
		case err != nil:
			return errors.Wrapf(err, "cannot read the location of DiskImage %s", name)
		case why != "":
			waiting = append(waiting, fmt.Sprintf("DiskImage %s is made from a backup: %s", name, why))
			continue
		}
		if d.backups == nil {
			d.backups = map[string]wire.ImageBackup{}
		}
		d.backups[name] = wire.ImageBackup{Location: loc, Namespace: cmp.Or(b.Namespace, img.Namespace), ID: b.ID, Disk: cmp.Or(b.Disk, v1alpha1.BackupRootDisk)}
	}
	if len(waiting) > 0 {
		return errors.New(strings.Join(waiting, "; "))
	}
	return nil
}

// intent is what the VM's node must make true.
func intent(vm *v1alpha1.VirtualMachine, d dependencies) wire.Intent {
	fp := vm.Spec.ForProvider
	vcpu, memory, _ := vm.Shape()
	m := wire.Machine{
		VCPU:        vcpu,
		MemoryBytes: memory.Value(),
		PublicKey:   fp.PublicKey,
		UserData:    fp.UserData,
	}
	maxVCPU, maxMemory := vm.MaxShape()
	m.MaxVCPU = maxVCPU
	if maxMemory != nil {
		m.MaxMemoryBytes = maxMemory.Value()
	}
	if fp.Swap != nil {
		m.SwapBytes = fp.Swap.Value()
	}
	if f := vm.BootFirmware(); f != nil {
		m.Firmware = wire.Firmware(*f)
	}
	if r := vm.Status.InstancetypeRef; r != nil && fp.Instancetype != nil {
		m.Instancetype = &wire.InstancetypeRevision{Kind: string(r.Kind), Name: r.Name, Revision: r.Revision}
	}
	for _, v := range d.volumes {
		disk := wire.Disk{Name: v.Name, VolumeUID: string(v.UID), SizeBytes: d.sizeOf(&v), Image: d.imageRef(v), Pool: v.Spec.ForProvider.StoragePool}
		if ext := meta.GetExternalName(&v); ext != "" { // attachable: imported, at its real size
			disk.ExternalName, disk.Image = ext, nil
			if c := v.Status.AtProvider.Capacity; c != nil {
				disk.SizeBytes = c.Value()
			}
		}
		m.Disks = append(m.Disks, disk)
	}
	for _, n := range d.networks {
		wn := wire.Network{
			Name:   n.Name,
			UID:    string(n.UID),
			Mode:   string(n.Spec.ForProvider.Mode),
			CIDR:   n.Spec.ForProvider.CIDR,
			Bridge: n.Spec.ForProvider.Bridge,
			// A VirtualNetwork names an existing network the way Crossplane
			// imports any resource; without the annotation the node makes
			// its own (the inuse controller never sets it).
			ExternalName: meta.GetExternalName(&n),
		}
		if v := n.Spec.ForProvider.VLAN; v != nil {
			wn.VLAN = *v
		}
		if p, ok := d.addresses[n.Name]; ok {
			wn.Address = p.String()
		}
		if d.overlay && ipam.Addressed(&n) {
			wn.VNI = n.Status.AtProvider.VNI
		}
		m.Networks = append(m.Networks, wn)
	}
	// The power requests are annotations, so they change no generation;
	// the intent's fingerprint changes with them, and Observe finds the
	// published intent out of date. A paused annotation of any value but
	// "true" leaves the guest running, as removing it does.
	a := vm.GetAnnotations()
	in := wire.Intent{
		ProtocolVersion: wire.ProtocolVersion,
		UID:             string(vm.UID),
		Namespace:       vm.Namespace,
		Name:            vm.Name,
		Generation:      vm.Generation,
		Running:         fp.IsRunning(),
		RestartNonce:    a[v1alpha1.AnnotationRestartRequestedAt],
		Paused:          a[v1alpha1.AnnotationPaused] == "true",
		ResetNonce:      a[v1alpha1.AnnotationResetRequestedAt],
		Fence:           fences(vm, d),
		Machine:         m,
	}
	if fp.Backend != nil {
		in.Backend.Type = string(*fp.Backend)
	}
	return withClaim(vm, in)
}

// fingerprint identifies an intent's content, to tell whether the one
// published is the one wanted without asking NATS.
func fingerprint(in wire.Intent) string {
	b, _ := json.Marshal(in) //nolint:errchkjson // plain structs
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

// NodeSelector merges the ProviderConfig's default selector with the VM's
// own; the VM's wins on a conflict.
func NodeSelector(defaults, own map[string]string) map[string]string {
	if len(defaults) == 0 {
		return own
	}
	out := make(map[string]string, len(defaults)+len(own))
	for k, v := range defaults {
		out[k] = v
	}
	for k, v := range own {
		out[k] = v
	}
	return out
}
