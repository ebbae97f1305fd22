package plugin

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
)

// clones is the kind clone creates; the user's own RBAC on it decides, as
// it would for kubectl create.
var clones = v1alpha1.SchemeGroupVersion.WithResource("virtualmachineclones")

// cloneCommand creates a VirtualMachineClone of a VM into a new one.
func (e *env) cloneCommand() *cobra.Command {
	var name string
	var snapshot bool
	var location string
	var filters []string
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "clone SOURCE NEW",
		Short: "Make a new VirtualMachine NEW from VirtualMachine SOURCE while it runs on (a VirtualMachineClone)",
		Long: "Make a new VirtualMachine NEW from VirtualMachine SOURCE (a VirtualMachineClone): a copy of each of its disks (Volumes NEW-VOLUME, " +
			"made from DiskImages of the same names) and its spec, with an identity of its own: uid, MACs, addresses, hostname and cloud-init instance id. " +
			"The copy is made on the node that holds SOURCE's disks, and NEW runs there; with --backup-location, the copy goes through a full backup " +
			"of SOURCE into that BackupLocation, and NEW runs on any node. A running SOURCE is copied as its disks are at that moment (crash-consistent). " +
			"With --snapshot, SOURCE is a VirtualMachineSnapshot: NEW gets the spec the snapshot kept and its VM's disks as the snapshot holds them, " +
			"while that VM runs on. Libvirt nodes copy both; nova nodes only a snapshot, making the disks of its Cinder snapshots.",
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 2 {
				return fmt.Errorf("name the source VirtualMachine and the new one, got %d arguments", len(args))
			}
			return nil
		},
		ValidArgsFunction: e.completeVMs,
		RunE: func(cmd *cobra.Command, args []string) error {
			kind := v1alpha1.CloneFromVirtualMachine
			if snapshot {
				kind = v1alpha1.CloneFromVirtualMachineSnapshot
			}
			c := &v1alpha1.VirtualMachineClone{
				TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.SchemeGroupVersion.String(), Kind: v1alpha1.VirtualMachineCloneKind},
				ObjectMeta: generated(name, args[1]),
				Spec: v1alpha1.VirtualMachineCloneSpec{
					Source:         v1alpha1.CloneSource{Kind: kind, Name: v1alpha1.LocalName(args[0])},
					Target:         v1alpha1.CloneTarget{Name: v1alpha1.LocalName(args[1])},
					LabelFilters:   filters,
					BackupLocation: location,
				},
			}
			return e.createAndWait(cmd.Context(), clones, c, timeout, finished(func(got *v1alpha1.VirtualMachineClone) (bool, bool, string, string) {
				return got.Done(), got.Status.Phase == v1alpha1.CloneSucceeded, string(got.Status.Phase), got.Status.Message
			}))
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "Name of the VirtualMachineClone (default: the new VM's name and a random suffix)")
	cmd.Flags().BoolVar(&snapshot, "snapshot", false, "SOURCE is a VirtualMachineSnapshot: copy its VM as the snapshot kept it")
	cmd.Flags().StringVar(&location, "backup-location", "", "Copy the disks through a full backup into this BackupLocation, so NEW runs on any node (not with --snapshot)")
	cmd.Flags().StringArrayVar(&filters, "label-filter", nil, `Copy the source's labels this pattern matches ("*" any characters; "!pattern" removes); repeatable, later ones win`)
	cmd.Flags().DurationVar(&timeout, "wait", 0, "Wait this long for the new VM to run (0: do not wait)")
	return cmd
}
