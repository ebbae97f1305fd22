package v1alpha1

import (
	"reflect"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
)

// BackupScheduleLabel names, on each VirtualMachineBackup a schedule
// made, the VirtualMachineBackupSchedule that made it.
const BackupScheduleLabel = Group + "/backup-schedule"

// BackupRetention is which of a schedule's backups are kept, as Proxmox's
// keep-last, keep-daily and keep-weekly: a backup is kept when any rule
// keeps it. Days and ISO weeks are counted in the schedule's time zone,
// and only those with a backup count. With no rule set every backup is
// kept. The newest backup that succeeded is always kept.
type BackupRetention struct {
	// Last keeps the newest N backups that succeeded.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=10000
	Last int32 `json:"last,omitempty"`
	// Daily keeps the newest backup that succeeded of each of the last N
	// days that have one.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=10000
	Daily int32 `json:"daily,omitempty"`
	// Weekly keeps the newest backup that succeeded of each of the last N
	// ISO weeks that have one.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=10000
	Weekly int32 `json:"weekly,omitempty"`
	// Failed keeps the newest N backups that failed, to show why; older
	// ones are deleted.
	// +optional
	// +kubebuilder:default=3
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100
	Failed int32 `json:"failed,omitempty"`
}

// VirtualMachineBackupScheduleSpec is when to back a VirtualMachine up,
// where to, and which backups to keep.
type VirtualMachineBackupScheduleSpec struct {
	// VMName is the VirtualMachine to back up, in the schedule's
	// namespace.
	VMName LocalName `json:"vmName"`
	// Location is the BackupLocation written to; the namespace must be
	// granted it.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Location string `json:"location"`
	// Schedule is when to take a backup, in the five fields of a
	// Kubernetes CronJob (minute hour day-of-month month day-of-week,
	// e.g. "0 3 * * *") or a macro such as @daily.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:XValidation:rule="!self.contains('TZ')",message="schedule takes no TZ or CRON_TZ: set spec.timeZone instead"
	Schedule string `json:"schedule"`
	// TimeZone is the IANA time zone Schedule and the days and weeks of
	// Retention are read in, e.g. Europe/Berlin; UTC when unset.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=64
	TimeZone *string `json:"timeZone,omitempty"`
	// Suspend stops new backups; the times that come due while it is set
	// are skipped, not made up later. Retention still applies.
	// +optional
	Suspend bool `json:"suspend,omitempty"`
	// Retention is which of the schedule's backups are kept; the others
	// are deleted once a backup finishes.
	// +optional
	Retention BackupRetention `json:"retention,omitempty"`
	// DeletionPolicy of the backups the schedule makes: Delete (the
	// default) deletes a pruned backup's data from its location, Retain
	// keeps it there.
	// +optional
	// +kubebuilder:default=Delete
	DeletionPolicy BackupDeletionPolicy `json:"deletionPolicy,omitempty"`
	// FullEvery makes every Nth backup read the disks whole: a backup is
	// full when the N-1 backups before it that succeeded were all
	// incremental. 0 (the default) reads only what changed whenever the
	// node can.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000
	FullEvery int32 `json:"fullEvery,omitempty"`
}

// VirtualMachineBackupScheduleStatus is what the hub did of the schedule.
type VirtualMachineBackupScheduleStatus struct {
	// Synced is True while the hub can follow the schedule; False with
	// the reason when it cannot (a schedule it cannot parse, backups it
	// may not delete).
	xpv2.ConditionedStatus `json:",inline"`
	// LastScheduleTime is the time of the last backup the schedule made.
	// +optional
	LastScheduleTime *metav1.Time `json:"lastScheduleTime,omitempty"`
	// LastSkippedTime is the last time that came due without a backup,
	// because the schedule was suspended or its last backup still ran.
	// +optional
	LastSkippedTime *metav1.Time `json:"lastSkippedTime,omitempty"`
	// NextScheduleTime is when the next backup is due.
	// +optional
	NextScheduleTime *metav1.Time `json:"nextScheduleTime,omitempty"`
	// Active is the schedule's backup still being taken.
	// +optional
	Active string `json:"active,omitempty"`
	// LastSuccessfulBackup is the newest of the schedule's backups that
	// succeeded, and LastSuccessfulTime when it completed.
	// +optional
	LastSuccessfulBackup string `json:"lastSuccessfulBackup,omitempty"`
	// +optional
	LastSuccessfulTime *metav1.Time `json:"lastSuccessfulTime,omitempty"`
	// Succeeded and Failed count the schedule's backups there are now.
	// +optional
	Succeeded int32 `json:"succeeded,omitempty"`
	// +optional
	Failed int32 `json:"failed,omitempty"`
	// Skipped counts the times that came due without a backup; Pruned the
	// backups retention deleted.
	// +optional
	Skipped int64 `json:"skipped,omitempty"`
	// +optional
	Pruned int64 `json:"pruned,omitempty"`
	// Message says what the schedule does or waits for.
	// +optional
	Message string `json:"message,omitempty"`
}

// +kubebuilder:object:root=true
// +kubebuilder:subresource:status

// A VirtualMachineBackupSchedule backs a VirtualMachine up at the times a
// cron schedule names, as a CronJob runs Jobs: each time it creates one
// VirtualMachineBackup, named after the schedule and the time, never two
// at once (a time that comes due while one runs is skipped). After a hub
// outage only the latest missed time is made up. Once a backup finishes,
// those its retention no longer keeps are deleted. The backups belong to
// the schedule: deleting it deletes them, unless deleted with
// --cascade=orphan.
// +kubebuilder:printcolumn:name="SCHEDULE",type="string",JSONPath=".spec.schedule"
// +kubebuilder:printcolumn:name="VM",type="string",JSONPath=".spec.vmName"
// +kubebuilder:printcolumn:name="LOCATION",type="string",JSONPath=".spec.location"
// +kubebuilder:printcolumn:name="SUSPEND",type="boolean",JSONPath=".spec.suspend"
// +kubebuilder:printcolumn:name="LAST",type="date",JSONPath=".status.lastScheduleTime"
// +kubebuilder:printcolumn:name="NEXT",type="string",JSONPath=".status.nextScheduleTime"
// +kubebuilder:printcolumn:name="KEPT",type="integer",JSONPath=".status.succeeded",priority=1
// +kubebuilder:printcolumn:name="ACTIVE",type="string",JSONPath=".status.active",priority=1
// +kubebuilder:printcolumn:name="LAST-SUCCESSFUL",type="string",JSONPath=".status.lastSuccessfulBackup",priority=1
// +kubebuilder:printcolumn:name="AGE",type="date",JSONPath=".metadata.creationTimestamp"
// +kubebuilder:resource:scope=Namespaced,shortName={vmbackupschedule,vmbackupschedules},categories={virtfleet}
// +kubebuilder:validation:XValidation:rule="size(self.metadata.name) <= 63",message="metadata.name must be at most 63 characters: it labels the schedule's backups"
type VirtualMachineBackupSchedule struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   VirtualMachineBackupScheduleSpec   `json:"spec"`
	Status VirtualMachineBackupScheduleStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// VirtualMachineBackupScheduleList contains a list of
// VirtualMachineBackupSchedule.
type VirtualMachineBackupScheduleList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []VirtualMachineBackupSchedule `json:"items"`
}

// VirtualMachineBackupSchedule type metadata.
var (
	VirtualMachineBackupScheduleKind             = reflect.TypeOf(VirtualMachineBackupSchedule{}).Name()
	VirtualMachineBackupScheduleGroupVersionKind = SchemeGroupVersion.WithKind(VirtualMachineBackupScheduleKind)
)

func init() {
	SchemeBuilder.Register(&VirtualMachineBackupSchedule{}, &VirtualMachineBackupScheduleList{})
}
