package v1alpha1

// LocalName names another resource of this group in the same namespace, such
// as a Volume or a VirtualNetwork. It is a DNS-1123 label, the name a libvirt
// network, a Neutron network or a Multus NetworkAttachmentDefinition can all
// carry unchanged.
// +kubebuilder:validation:MinLength=1
// +kubebuilder:validation:MaxLength=63
// +kubebuilder:validation:XValidation:rule="self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')",messageExpression="'\"' + self + '\" is not a valid name: use a DNS-1123 label (lowercase letters, digits and \"-\", starting and ending with a letter or digit)'"
type LocalName string

// LocalReference refers to another resource in the same namespace.
type LocalReference struct {
	// Name of the referenced resource.
	Name LocalName `json:"name"`
}

// Well-known annotations.
const (
	// AnnotationRestartRequestedAt requests a restart of a VirtualMachine. Each
	// new value restarts the guest once; the value is usually a timestamp
	// (kubectl annotate vm NAME compute.virtfleet.io/restart-requested-at="$(date -Is)").
	AnnotationRestartRequestedAt = Group + "/restart-requested-at"

	// AnnotationPaused, set to "true", pauses a running VirtualMachine: its
	// guest's vCPUs stop and its memory is kept, so it runs no instruction
	// and answers nothing until the annotation is removed (or set to any
	// other value), which resumes it where it was. The phase is Paused
	// meanwhile, and the VM is not Ready. Only a guest that should run is
	// paused: running false wins, and a stopped VM stays stopped; a VM
	// started while the annotation says "true" boots and is paused as soon
	// as it runs, and stays paused across restarts and resets. A guest the
	// hypervisor halted on a fault stays Failed, neither paused nor
	// resumed.
	AnnotationPaused = Group + "/paused"

	// AnnotationResetRequestedAt requests a hard reset of a VirtualMachine,
	// like pressing its reset button: the guest restarts at once, without
	// being asked to shut down (no ACPI), so what it has not written to
	// disk is lost. Each new value resets a running (or paused) guest once
	// and counts in restartCount, as AnnotationRestartRequestedAt does; the
	// value a guest is created or started with counts as handled.
	AnnotationResetRequestedAt = Group + "/reset-requested-at"

	// AnnotationNode records the node the hub placed a resource on. It is
	// written before the intent is published, so a hub that crashes between
	// the two finds its earlier choice instead of placing the resource twice.
	AnnotationNode = Group + "/node"

	// AnnotationAdopted records the uid of the orphaned guest a
	// VirtualMachine adopted (written with AnnotationNode, before the claim
	// is published), so every later intent names the same guest.
	AnnotationAdopted = Group + "/adopted"

	// AnnotationSeal is the hub's mark on the node (and adopted orphan) it
	// recorded: a keyed hash of them and the resource's uid that tenants
	// cannot make. A node annotation without a valid seal was set by hand
	// and is honoured only where a cluster administrator allowed the
	// namespace to choose nodes (TenantGrant.ChooseNode) or to import.
	AnnotationSeal = Group + "/seal"

	// AnnotationBindingEpoch records when the hub made a VirtualMachine's
	// binding (Unix nanoseconds, never less than the epoch before it);
	// AnnotationSeal covers it, so a seal copied from an earlier binding
	// is told from the current one (VirtualMachineObservation.Binding).
	AnnotationBindingEpoch = Group + "/binding-epoch"

	// AnnotationMigration records, on a VirtualMachine being migrated, the
	// uid of its VirtualMachineMigration and the node it moves to
	// ("<uid>/<node>"), sealed by AnnotationMigrationSeal. The hub writes
	// it when it chose the target, before it tells any node, and removes
	// it when the guest runs on the target (moving AnnotationNode there)
	// or the migration failed.
	AnnotationMigration = Group + "/migration"

	// AnnotationMigrationSeal is the hub's mark on AnnotationMigration: a
	// migration target written by hand is never acted on.
	AnnotationMigrationSeal = Group + "/migration-seal"

	// AnnotationMigrationCancel, set to the uid of the migration
	// AnnotationMigration names, asks the source to abort it if it still
	// runs: its VirtualMachineMigration was deleted. A tenant may set it
	// too; it only cancels its own VM's migration.
	AnnotationMigrationCancel = Group + "/migration-cancel"

	// AnnotationLeftovers lists, comma-separated, the nodes that may still
	// hold something of a VirtualMachine that no longer runs there: the
	// source of a migration that succeeded, the target of one that
	// failed, the lost node a VM was restarted away from. The hub deletes
	// the VM's intent on each and drops the node from the list once its
	// report is gone.
	AnnotationLeftovers = Group + "/leftovers"

	// AnnotationLeftoversSeal is the hub's mark on AnnotationLeftovers: a
	// list written by hand keeps no intent and counts no guest anywhere.
	AnnotationLeftoversSeal = Group + "/leftovers-seal"

	// AnnotationRestartedFrom records, on a VirtualMachine with
	// availability Restart, the lost node the hub last restarted it away
	// from and when ("<node>@<RFC 3339 time>"). It is the story's record
	// only; the hub acts on AnnotationNode and AnnotationLeftovers.
	AnnotationRestartedFrom = Group + "/restarted-from"

	// AnnotationRestore records, on a VirtualMachine being restored, the
	// uid of its VirtualMachineRestore and of the snapshot it restores
	// ("<restore uid>/<snapshot uid>"), sealed by AnnotationRestoreSeal.
	// The hub writes it once the snapshot is ready on the VM's node, tells
	// the node (wire.Restore), and removes it when the node reported the
	// restore over. A restore written by hand is never acted on.
	AnnotationRestore = Group + "/restore"

	// AnnotationRestoreSeal is the hub's mark on AnnotationRestore.
	AnnotationRestoreSeal = Group + "/restore-seal"
)
