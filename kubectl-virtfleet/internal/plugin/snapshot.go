package plugin

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"

	v1alpha1 "github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
)

// The kinds snapshot, restore, backup and backup verify create; the user's own RBAC on
// them decides, as it would for kubectl create.
var (
	snapshots     = v1alpha1.SchemeGroupVersion.WithResource("virtualmachinesnapshots")
	restores      = v1alpha1.SchemeGroupVersion.WithResource("virtualmachinerestores")
	backups       = v1alpha1.SchemeGroupVersion.WithResource("virtualmachinebackups")
	verifications = v1alpha1.SchemeGroupVersion.WithResource("virtualmachinebackupverifications")
)

// waitPoll is how often --wait looks at the object it waits for.
const waitPoll = time.Second

// snapshotCommand creates a VirtualMachineSnapshot of a VM.
func (e *env) snapshotCommand() *cobra.Command {
	var name string
	var memory bool
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:               "snapshot NAME",
		Short:             "Snapshot a VirtualMachine's disks (and with --memory its running memory) as a VirtualMachineSnapshot",
		Args:              exactlyOneVM,
		ValidArgsFunction: e.completeVMs,
		RunE: func(cmd *cobra.Command, args []string) error {
			s := &v1alpha1.VirtualMachineSnapshot{
				TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.SchemeGroupVersion.String(), Kind: v1alpha1.VirtualMachineSnapshotKind},
				ObjectMeta: generated(name, args[0]),
				Spec:       v1alpha1.VirtualMachineSnapshotSpec{VMName: v1alpha1.LocalName(args[0]), IncludeMemory: memory},
			}
			return e.createAndWait(cmd.Context(), snapshots, s, timeout, finished(func(got *v1alpha1.VirtualMachineSnapshot) (bool, bool, string, string) {
				return got.Done(), got.Status.Phase == v1alpha1.SnapshotSucceeded, string(got.Status.Phase), got.Status.Message
			}))
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "Name of the VirtualMachineSnapshot (default: the VM's name and a random suffix)")
	cmd.Flags().BoolVar(&memory, "memory", false, "Keep the running guest's memory, so a restore resumes it where it was")
	cmd.Flags().DurationVar(&timeout, "wait", 0, "Wait this long for the snapshot to be taken (0: do not wait)")
	return cmd
}

// restoreCommand creates a VirtualMachineRestore of a snapshot into its VM,
// or makes a new VM from a backup.
func (e *env) restoreCommand() *cobra.Command {
	var name, snapshot, backup string
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "restore NAME (--snapshot SNAPSHOT | --backup BACKUP)",
		Short: "Bring a VirtualMachine back to one of its VirtualMachineSnapshots (a VirtualMachineRestore), or make a new VirtualMachine NAME from a VirtualMachineBackup",
		Long: "With --snapshot, bring VirtualMachine NAME back to one of its VirtualMachineSnapshots (a VirtualMachineRestore).\n\n" +
			"With --backup, make a new VirtualMachine NAME from a VirtualMachineBackup, on any node: a DiskImage (NAME-root, NAME-VOLUME) of each of the backup's disks, " +
			"a Volume of each as large as the backed-up VM's, and the VM with the backed-up VM's spec on them (its own addresses). The backed-up VM must still exist; " +
			"for one that is gone, make them as the README's Backups section shows.",
		Args:              exactlyOneVM,
		ValidArgsFunction: e.completeVMs,
		RunE: func(cmd *cobra.Command, args []string) error {
			switch {
			case (snapshot == "") == (backup == ""):
				return errors.New("give --snapshot or --backup, one of them")
			case backup != "":
				if name != "" {
					return errors.New("--name names a VirtualMachineRestore; a restore from a backup makes VM NAME")
				}
				return e.restoreFromBackup(cmd.Context(), args[0], backup, timeout)
			}
			r := &v1alpha1.VirtualMachineRestore{
				TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.SchemeGroupVersion.String(), Kind: v1alpha1.VirtualMachineRestoreKind},
				ObjectMeta: generated(name, args[0]),
				Spec:       v1alpha1.VirtualMachineRestoreSpec{SnapshotName: v1alpha1.LocalName(snapshot), VMName: v1alpha1.LocalName(args[0])},
			}
			return e.createAndWait(cmd.Context(), restores, r, timeout, finished(func(got *v1alpha1.VirtualMachineRestore) (bool, bool, string, string) {
				return got.Done(), got.Status.Phase == v1alpha1.RestoreSucceeded, string(got.Status.Phase), got.Status.Message
			}))
		},
	}
	cmd.Flags().StringVar(&snapshot, "snapshot", "", "The VirtualMachineSnapshot of VM NAME to restore")
	cmd.Flags().StringVar(&backup, "backup", "", "The VirtualMachineBackup to make the new VM NAME from")
	cmd.Flags().StringVar(&name, "name", "", "Name of the VirtualMachineRestore (default: the VM's name and a random suffix)")
	cmd.Flags().DurationVar(&timeout, "wait", 0, "Wait this long for the restore to finish, or the new VM to run (0: do not wait)")
	return cmd
}

// backupCommand creates a VirtualMachineBackup of a VM.
func (e *env) backupCommand() *cobra.Command {
	var name, location string
	var full bool
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:               "backup NAME --location LOCATION",
		Short:             "Back a VirtualMachine's disks up to a BackupLocation (a VirtualMachineBackup); only what changed since its last backup is read",
		Args:              exactlyOneVM,
		ValidArgsFunction: e.completeVMs,
		RunE: func(cmd *cobra.Command, args []string) error {
			b := &v1alpha1.VirtualMachineBackup{
				TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.SchemeGroupVersion.String(), Kind: v1alpha1.VirtualMachineBackupKind},
				ObjectMeta: generated(name, args[0]),
				Spec:       v1alpha1.VirtualMachineBackupSpec{VMName: v1alpha1.LocalName(args[0]), Location: location, Full: full},
			}
			return e.createAndWait(cmd.Context(), backups, b, timeout, finished(func(got *v1alpha1.VirtualMachineBackup) (bool, bool, string, string) {
				return got.Done(), got.Status.Phase == v1alpha1.BackupSucceeded, string(got.Status.Phase), got.Status.Message
			}))
		},
	}
	cmd.Flags().StringVar(&location, "location", "", "The BackupLocation to write to (required)")
	cmd.Flags().StringVar(&name, "name", "", "Name of the VirtualMachineBackup (default: the VM's name and a random suffix)")
	cmd.Flags().BoolVar(&full, "full", false, "Read every disk whole, not only what changed since the VM's last backup")
	cmd.Flags().DurationVar(&timeout, "wait", 0, "Wait this long for the backup to finish (0: do not wait)")
	_ = cmd.MarkFlagRequired("location")
	cmd.AddCommand(e.verifyCommand())
	return cmd
}

// listedRanges is how many corrupt ranges --wait prints of a verification
// that found some; the object lists more.
const listedRanges = 10

// verifyCommand creates a VirtualMachineBackupVerification of a backup.
func (e *env) verifyCommand() *cobra.Command {
	var name, location, id string
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "verify [BACKUP | --location LOCATION --id ID]",
		Short: "Read a VirtualMachineBackup back from its BackupLocation and report every range whose chunk is missing or does not match (a VirtualMachineBackupVerification)",
		Long: "Read a VirtualMachineBackup back from its BackupLocation and report every range whose chunk is missing or does not match (a VirtualMachineBackupVerification).\n\n" +
			"Name the VirtualMachineBackup, or, for a backup whose object was deleted with deletionPolicy Retain, its location and ID (the object's uid). " +
			"To back up a VM named verify, use kubectl create.",
		Args: func(_ *cobra.Command, args []string) error {
			switch {
			case len(args) > 1:
				return fmt.Errorf("name one VirtualMachineBackup, got %d arguments", len(args))
			case len(args) == 1 && (id != "" || location != ""):
				return errors.New("name the VirtualMachineBackup or give --location and --id, not both")
			case len(args) == 0 && (id == "" || location == ""):
				return errors.New("name a VirtualMachineBackup, or give --location and --id of a backup whose object is gone")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			v := &v1alpha1.VirtualMachineBackupVerification{
				TypeMeta: metav1.TypeMeta{APIVersion: v1alpha1.SchemeGroupVersion.String(), Kind: v1alpha1.VirtualMachineBackupVerificationKind},
			}
			if len(args) == 1 {
				v.ObjectMeta = generated(name, args[0])
				v.Spec.BackupName = v1alpha1.LocalName(args[0])
			} else {
				v.ObjectMeta = generated(name, "backup-"+strings.ToLower(id))
				v.Spec.Backup = &v1alpha1.BackupInLocation{Location: location, ID: id}
			}
			return e.createAndWait(cmd.Context(), verifications, v, timeout, finished(func(got *v1alpha1.VirtualMachineBackupVerification) (bool, bool, string, string) {
				return got.Done(), got.Status.Phase == v1alpha1.VerificationSucceeded, string(got.Status.Phase), verificationMessage(got.Status)
			}))
		},
	}
	cmd.Flags().StringVar(&location, "location", "", "The BackupLocation of a backup whose VirtualMachineBackup is gone (with --id)")
	cmd.Flags().StringVar(&id, "id", "", "The ID of a backup whose VirtualMachineBackup is gone: the object's uid (with --location)")
	cmd.Flags().StringVar(&name, "name", "", "Name of the VirtualMachineBackupVerification (default: the backup's name and a random suffix)")
	cmd.Flags().DurationVar(&timeout, "wait", 0, "Wait this long for the verification to finish (0: do not wait)")
	return cmd
}

// verificationMessage is the status's message and, of a verification that
// found corrupt ranges, the first of them.
func verificationMessage(st v1alpha1.VirtualMachineBackupVerificationStatus) string {
	var b strings.Builder
	b.WriteString(st.Message)
	for _, r := range st.Corrupt[:min(len(st.Corrupt), listedRanges)] {
		fmt.Fprintf(&b, "\n  disk %s, bytes %d-%d (chunk %s): %s", r.Disk, r.Offset, r.Offset+r.Length, r.Chunk, r.Reason)
	}
	return b.String()
}

// finished is what --wait asks of an object of type T read back: whether
// it is over, whether it went well, and its phase and message.
func finished[T any](judge func(*T) (done, succeeded bool, phase, msg string)) func(*unstructured.Unstructured) (bool, error) {
	return func(u *unstructured.Unstructured) (bool, error) {
		got := new(T)
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, got); err != nil {
			return false, err
		}
		return outcome(judge(got))
	}
}

// generated is the metadata of an object named name, or named after the
// VM with a suffix the API server chooses.
func generated(name, vm string) metav1.ObjectMeta {
	if name != "" {
		return metav1.ObjectMeta{Name: name}
	}
	return metav1.ObjectMeta{GenerateName: vm + "-"}
}

// outcome is what --wait makes of an object's phase: done or not, and an
// error naming the phase and message when it ended other than well.
func outcome(done, succeeded bool, phase, msg string) (bool, error) {
	switch {
	case !done:
		return false, nil
	case succeeded:
		return true, nil
	default:
		return true, fmt.Errorf("%s: %s", phase, msg)
	}
}

// dynamic is a client of the API server the user's kubeconfig names, and
// the namespace it names.
func (e *env) dynamic() (dynamic.Interface, string, error) {
	cfg, ns, err := e.rest()
	if err != nil {
		return nil, "", err
	}
	dc, err := dynamic.NewForConfig(cfg)
	return dc, ns, err
}

// createAndWait creates obj in the namespace, says so, and, with a
// timeout, waits until done says it is over.
func (e *env) createAndWait(ctx context.Context, gvr schema.GroupVersionResource, obj runtime.Object, timeout time.Duration, done func(*unstructured.Unstructured) (bool, error)) error {
	dc, ns, err := e.dynamic()
	if err != nil {
		return err
	}
	u, err := toUnstructured(obj)
	if err != nil {
		return err
	}
	made, err := dc.Resource(gvr).Namespace(ns).Create(ctx, u, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	fmt.Fprintf(e.out, "%s %s/%s created\n", made.GetKind(), ns, made.GetName())
	if timeout <= 0 {
		return nil
	}
	return e.waitFor(ctx, dc, gvr, ns, made.GetName(), timeout, done)
}

// waitFor waits at most timeout until done says object name is over, and
// says how it ended.
func (e *env) waitFor(ctx context.Context, dc dynamic.Interface, gvr schema.GroupVersionResource, ns, name string, timeout time.Duration, done func(*unstructured.Unstructured) (bool, error)) error {
	var last error
	kind := gvr.Resource
	err := wait.PollUntilContextTimeout(ctx, waitPoll, timeout, true, func(ctx context.Context) (bool, error) {
		u, err := dc.Resource(gvr).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		kind = u.GetKind()
		finished, err := done(u)
		last = err
		return finished, nil
	})
	if err != nil {
		return fmt.Errorf("%s %s/%s is not done: %w", kind, ns, name, err)
	}
	if last != nil {
		return fmt.Errorf("%s %s/%s %w", kind, ns, name, last)
	}
	fmt.Fprintf(e.out, "%s %s/%s succeeded\n", kind, ns, name)
	return nil
}
