package compose

import (
	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/fieldpath"
	fnv1 "github.com/crossplane/function-sdk-go/proto/v1"
	"github.com/crossplane/function-sdk-go/request"
	"k8s.io/apimachinery/pkg/api/resource"
)

// RequirementSizes is the name under which a Composition's pipeline step
// requires the EnvironmentConfig of size classes
// (requirements.requiredResources); Crossplane fetches it before it calls
// the function, and composes again when it changes.
const RequirementSizes = "sizes"

// Sizes are the size classes a composite may name: the data of one
// EnvironmentConfig (package/sizes.yaml), the one place a platform team
// defines its instance types for every Composition. Every VM composed after
// a change gets the new shape; a running VM takes it at its next restart.
type Sizes struct {
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

// sizesOf reads the size classes from the EnvironmentConfig the request
// carries as RequirementSizes.
func sizesOf(req *fnv1.RunFunctionRequest) (*Sizes, error) {
	rs, ok, err := request.GetRequiredResource(req, RequirementSizes)
	if err != nil {
		return nil, errors.Wrap(err, "cannot read the size classes' EnvironmentConfig")
	}
	if !ok {
		return nil, errors.Errorf("the Composition's step requires no %q resource: list the size classes' EnvironmentConfig under requirements.requiredResources with requirementName %s", RequirementSizes, RequirementSizes)
	}
	if len(rs) != 1 {
		return nil, errors.Errorf("the size classes come from exactly one EnvironmentConfig; %d match the Composition's requirement %q (apply package/sizes.yaml)", len(rs), RequirementSizes)
	}
	s := &Sizes{}
	if err := fieldpath.Pave(rs[0].Resource.Object).GetValueInto("data", s); err != nil {
		return nil, errors.Wrapf(err, "cannot read the size classes from EnvironmentConfig %s", rs[0].Resource.GetName())
	}
	return s, nil
}
