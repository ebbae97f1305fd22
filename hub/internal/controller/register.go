// Package controller wires the hub's controllers: one package per kind, each
// with its own SetupGated, and the field indexes they share.
package controller

import (
	"context"

	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/crossplane/crossplane-runtime/v2/pkg/controller"

	"github.com/virtfleet/virtfleet/hub/internal/controller/backup"
	"github.com/virtfleet/virtfleet/hub/internal/controller/backupgc"
	"github.com/virtfleet/virtfleet/hub/internal/controller/backupschedule"
	"github.com/virtfleet/virtfleet/hub/internal/controller/backupverification"
	"github.com/virtfleet/virtfleet/hub/internal/controller/clone"
	"github.com/virtfleet/virtfleet/hub/internal/controller/diskimage"
	"github.com/virtfleet/virtfleet/hub/internal/controller/hypervisornode"
	"github.com/virtfleet/virtfleet/hub/internal/controller/index"
	"github.com/virtfleet/virtfleet/hub/internal/controller/migration"
	"github.com/virtfleet/virtfleet/hub/internal/controller/placementgroup"
	"github.com/virtfleet/virtfleet/hub/internal/controller/providerconfig"
	"github.com/virtfleet/virtfleet/hub/internal/controller/restore"
	"github.com/virtfleet/virtfleet/hub/internal/controller/snapshot"
	"github.com/virtfleet/virtfleet/hub/internal/controller/tenantquota"
	"github.com/virtfleet/virtfleet/hub/internal/controller/virtualmachine"
	"github.com/virtfleet/virtfleet/hub/internal/controller/virtualnetwork"
	"github.com/virtfleet/virtfleet/hub/internal/controller/volume"
	"github.com/virtfleet/virtfleet/hub/internal/fleet"
	"github.com/virtfleet/virtfleet/hub/internal/ipam"
	"github.com/virtfleet/virtfleet/hub/internal/wake"
)

// SetupGated adds every controller, each once its CRD is established.
// volumes and images are the Notifiers the Pool's fleets feed with Volume
// and image report changes (Fleet.Volumes.Subscribe, Fleet.Images.Subscribe).
// nodes hears of the nodes whose heartbeats changed
// (Fleet.SubscribeNodeChanges).
// mo configures live migrations, so snapshots, ro restores, bo backups,
// bvo their verifications, bso backup schedules and gco the garbage
// collection of backup locations. vo.Memory
// owns what every controller remembers of each object, and vo.Polls
// spreads every managed controller's drift polls.
func SetupGated(ctx context.Context, mgr ctrl.Manager, o controller.Options, vo virtualmachine.Options, mo migration.Options, so snapshot.Options, ro restore.Options, bo backup.Options, bvo backupverification.Options, bso backupschedule.Options, gco backupgc.Options, volumes, images *wake.Notifier, nodes *hypervisornode.Changes, allowances *fleet.Allowances) error {
	if err := index.Setup(ctx, mgr); err != nil {
		return err
	}
	if err := ipam.Index(ctx, mgr.GetFieldIndexer()); err != nil {
		return err
	}
	if err := providerconfig.SetupGated(mgr, o); err != nil {
		return err
	}
	if err := virtualmachine.SetupGated(mgr, o, vo); err != nil {
		return err
	}
	if err := volume.SetupGated(mgr, o, vo.Pool, vo.FencingTimeout, volumes, vo.Memory, vo.Polls, vo.Quotas); err != nil {
		return err
	}
	if err := virtualnetwork.SetupGated(mgr, o, vo.Addresses, vo.Memory, vo.Polls); err != nil {
		return err
	}
	if err := tenantquota.SetupGated(mgr, o, vo.Quotas); err != nil {
		return err
	}
	if err := hypervisornode.SetupGated(mgr, o, vo.Pool.Fleets, nodes, allowances); err != nil {
		return err
	}
	if err := placementgroup.SetupGated(mgr, o, vo.Pool.Fleets); err != nil {
		return err
	}
	if err := migration.SetupGated(mgr, o, mo); err != nil {
		return err
	}
	if err := snapshot.SetupGated(mgr, o, so); err != nil {
		return err
	}
	if err := restore.SetupGated(mgr, o, ro); err != nil {
		return err
	}
	if err := clone.SetupGated(mgr, o, clone.Options{Pool: vo.Pool}); err != nil {
		return err
	}
	if err := backup.SetupGated(mgr, o, bo); err != nil {
		return err
	}
	if err := backupverification.SetupGated(mgr, o, bvo); err != nil {
		return err
	}
	if err := backupschedule.SetupGated(mgr, o, bso); err != nil {
		return err
	}
	if err := backupgc.SetupGated(mgr, o, gco); err != nil {
		return err
	}
	return diskimage.SetupGated(mgr, o, vo.Pool, images, vo.Memory, vo.Polls)
}
