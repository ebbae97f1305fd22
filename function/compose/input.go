package compose

import (
	"maps"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// InputGroupVersion is the API version of the function's input, the block a
// Composition's pipeline step gives it.
var InputGroupVersion = schema.GroupVersion{Group: "compose.fn.virtfleet.io", Version: "v1alpha1"}

// InputKind is the kind of the function's input.
const InputKind = "Sizes"

// Input is the function's input: the size classes a composite may name. They
// live in the Composition's pipeline step, so a platform team changes its
// instance types in one place (and versions them with the Composition), and
// every VM composed after the change gets the new shape.
type Input struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Sizes by name, such as small, medium and large.
	Sizes map[string]Size `json:"sizes"`
	// DefaultSize is used when a composite names neither a size nor an
	// explicit vcpu and memory.
	DefaultSize string `json:"defaultSize,omitempty"`
	// BootDiskSize is the boot Volume's size when a composite does not say.
	BootDiskSize *resource.Quantity `json:"bootDiskSize,omitempty"`
}

// Size is one size class.
type Size struct {
	VCPU   int32             `json:"vcpu"`
	Memory resource.Quantity `json:"memory"`
}

// DeepCopyObject makes Input a runtime.Object, which the SDK decodes into.
// Sizes hold only values, so cloning the map is a deep copy.
func (in *Input) DeepCopyObject() runtime.Object {
	out := *in
	in.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	out.Sizes = maps.Clone(in.Sizes)
	if in.BootDiskSize != nil {
		q := in.BootDiskSize.DeepCopy()
		out.BootDiskSize = &q
	}
	return &out
}
