package reconciler

import (
	"context"
	"fmt"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/agent/driver"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
)

// Operations of driver.Migrator, as AgentMetrics.DriverCalls labels them.
const (
	OpPrepareIncoming = "prepare-incoming"
	OpMigrate         = "migrate"
)

// incomingWait is how often a target node looks for a guest it is ready to
// receive when no driver event says it arrived.
const incomingWait = 5 * time.Second

// migrator is the driver's Migrator, or a Terminal error saying the node's
// backend moves no guest live.
func (r *Reconciler) migrator() (driver.Migrator, error) {
	m, ok := r.driver.(driver.Migrator)
	if !ok {
		return nil, driver.Terminalf("node %s cannot migrate guests live: its backend does not support it", r.node)
	}
	return m, nil
}

// incoming reconciles the intent of a migration's target: the node gets
// ready for the guest and says so; it never creates or starts the guest.
// Once the guest is here it is reported as it runs, still with Incoming,
// until the hub makes the intent the guest's own.
func (r *Reconciler) incoming(ctx context.Context, in wire.Intent, m driver.Machine) (time.Duration, error) {
	mig, err := r.migrator()
	if err != nil {
		return 0, r.report(ctx, failed(in, r.node, err))
	}
	obs, err := DriverCall(r.metrics, OpObserve, func() (driver.Observation, error) { return r.driver.Observe(ctx, in.UID) })
	switch {
	case driver.IsNotFound(err):
		if err := r.call(OpPrepareIncoming, func() error { return mig.PrepareIncoming(ctx, m) }); err != nil {
			if driver.IsTerminal(err) {
				return 0, r.report(ctx, failed(in, r.node, err))
			}
			return 0, errors.Wrap(err, "cannot prepare for the incoming guest")
		}
		obs = driver.Observation{UID: in.UID, Phase: driver.PhasePending, Node: r.node,
			Message: fmt.Sprintf("ready to receive the guest from node %s", in.Incoming.SourceNode)}
	case err != nil:
		return 0, errors.Wrap(err, "cannot observe the incoming guest")
	}
	rep := report(in, obs)
	rep.Incoming = in.Incoming.ID
	if err := r.report(ctx, rep); err != nil {
		return 0, err
	}
	if obs.Phase == driver.PhaseRunning {
		return 0, nil
	}
	return incomingWait, nil
}

// migrate reconciles the intent of a migration's source: it starts the
// migration once and reports its progress. It never calls Ensure: the
// guest must not be started, stopped or made again here while it may be
// moving, or after it moved.
func (r *Reconciler) migrate(ctx context.Context, in wire.Intent, m driver.Machine) (time.Duration, error) {
	var (
		st  driver.MigrationStatus
		err error
	)
	if in.Migration.TargetNode == r.node {
		st, err = r.migrateHost(ctx, in, m)
	} else {
		var mig driver.Migrator
		if mig, err = r.migrator(); err != nil {
			return 0, r.report(ctx, failed(in, r.node, err))
		}
		t := driver.MigrationTarget{ID: in.Migration.ID, Node: in.Migration.TargetNode, URI: in.Migration.TargetURI, Cancel: in.Migration.Cancel}
		st, err = DriverCall(r.metrics, OpMigrate, func() (driver.MigrationStatus, error) { return mig.Migrate(ctx, m, t) })
	}
	switch {
	case driver.IsNotFound(err):
		// Not here and not moved away by this process: the target's report
		// tells the hub whether the guest runs there.
		st = driver.MigrationStatus{ID: in.Migration.ID, Phase: driver.MigrationFailed, Message: fmt.Sprintf("the guest is not on node %s", r.node)}
	case driver.IsTerminal(err):
		st = driver.MigrationStatus{ID: in.Migration.ID, Phase: driver.MigrationFailed, Message: err.Error()}
	case err != nil:
		return 0, errors.Wrap(err, "cannot migrate the guest")
	}
	rep, err := r.sourceReport(ctx, in, st)
	if err != nil {
		return 0, err
	}
	if err := r.report(ctx, rep); err != nil {
		return 0, err
	}
	if st.Phase == driver.MigrationRunning {
		return r.opts.PollTransitional, nil
	}
	return 0, nil
}

// migrateHost moves the guest between the backend's own hosts; a node
// whose backend cannot fails it as Terminal.
func (r *Reconciler) migrateHost(ctx context.Context, in wire.Intent, m driver.Machine) (driver.MigrationStatus, error) {
	hm, ok := r.driver.(driver.HostMigrator)
	if !ok {
		return driver.MigrationStatus{}, driver.Terminalf("node %s cannot move guests between hosts of its backend", r.node)
	}
	return DriverCall(r.metrics, OpMigrate, func() (driver.MigrationStatus, error) {
		return hm.MigrateHost(ctx, m, in.Migration.ID, in.Migration.TargetHost)
	})
}

// sourceReport is the source's report during a migration: the guest as it
// runs here, or, once it left, as last reported (it runs on, elsewhere),
// with the migration's status.
func (r *Reconciler) sourceReport(ctx context.Context, in wire.Intent, st driver.MigrationStatus) (wire.Report, error) {
	obs, err := DriverCall(r.metrics, OpObserve, func() (driver.Observation, error) { return r.driver.Observe(ctx, in.UID) })
	var rep wire.Report
	switch {
	case err == nil:
		rep = report(in, obs)
	case driver.IsNotFound(err):
		rep, _ = r.reports.last(in.UID)
		rep.UID, rep.ObservedGeneration = in.UID, in.Generation
		if rep.Phase == "" {
			rep.Phase = wire.PhaseUnknown
		}
		if st.Phase == driver.MigrationSucceeded {
			rep.Message = fmt.Sprintf("migrated to node %s", in.Migration.TargetNode)
		}
	default:
		return wire.Report{}, errors.Wrap(err, "cannot observe the migrating guest")
	}
	rep.Migration = migrationReport(st)
	return rep, nil
}

// migrationReport is the wire form of a driver's migration status.
func migrationReport(st driver.MigrationStatus) *wire.MigrationReport {
	out := &wire.MigrationReport{
		ID:                   st.ID,
		Phase:                wire.MigrationPhase(st.Phase),
		TotalBytes:           st.TotalBytes,
		ProcessedBytes:       st.ProcessedBytes,
		DowntimeMilliseconds: st.Downtime.Milliseconds(),
		Message:              st.Message,
	}
	if !st.StartedAt.IsZero() {
		t := st.StartedAt.UTC()
		out.StartedAt = &t
	}
	if !st.FinishedAt.IsZero() {
		t := st.FinishedAt.UTC()
		out.FinishedAt = &t
	}
	return out
}
