package driver_test

import (
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
)

// TestPhasesAreTheSameAcrossDriverWireAndAPI pins every phase of the three
// enums (see driver.Phases for why there are three): each row is one phase,
// spelled alike in all of them, and each enum's list, and the CRD's
// validation, hold exactly these. A phase added to one and not the others
// fails here, not as a guest shown Unknown.
func TestPhasesAreTheSameAcrossDriverWireAndAPI(t *testing.T) {
	rows := []struct {
		driver driver.Phase
		wire   wire.Phase
		api    v1alpha1.Phase
	}{
		{driver.PhasePending, wire.PhasePending, v1alpha1.PhasePending},
		{driver.PhaseScheduled, wire.PhaseScheduled, v1alpha1.PhaseScheduled},
		{driver.PhaseProvisioning, wire.PhaseProvisioning, v1alpha1.PhaseProvisioning},
		{driver.PhaseStarting, wire.PhaseStarting, v1alpha1.PhaseStarting},
		{driver.PhaseRunning, wire.PhaseRunning, v1alpha1.PhaseRunning},
		{driver.PhasePaused, wire.PhasePaused, v1alpha1.PhasePaused},
		{driver.PhaseStopping, wire.PhaseStopping, v1alpha1.PhaseStopping},
		{driver.PhaseStopped, wire.PhaseStopped, v1alpha1.PhaseStopped},
		{driver.PhaseFailed, wire.PhaseFailed, v1alpha1.PhaseFailed},
		{driver.PhaseUnknown, wire.PhaseUnknown, v1alpha1.PhaseUnknown},
		{driver.PhaseDeleting, wire.PhaseDeleting, v1alpha1.PhaseDeleting},
	}
	var drivers []driver.Phase
	var wires []wire.Phase
	var apis []v1alpha1.Phase
	var names []string
	for _, r := range rows {
		assert.Equal(t, string(r.driver), string(r.wire), "driver and wire spell %s alike", r.driver)
		assert.Equal(t, string(r.wire), string(r.api), "wire and API spell %s alike", r.wire)
		drivers, wires, apis = append(drivers, r.driver), append(wires, r.wire), append(apis, r.api)
		names = append(names, string(r.api))
	}
	assert.Equal(t, drivers, driver.Phases, "driver.Phases")
	assert.Equal(t, wires, wire.Phases, "wire.Phases")
	assert.Equal(t, apis, v1alpha1.Phases, "v1alpha1.Phases")
	assert.Equal(t, names, crdPhases(t), "the CRD's enum of status.atProvider.phase")
}

// crdPhases reads the enum the generated VirtualMachine CRD validates
// status.atProvider.phase with.
func crdPhases(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("../../package/crds/compute.virtfleet.io_virtualmachines.yaml")
	require.NoError(t, err)
	crd := &apiextensionsv1.CustomResourceDefinition{}
	require.NoError(t, yaml.Unmarshal(b, crd))
	require.Len(t, crd.Spec.Versions, 1)
	phase := crd.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["status"].Properties["atProvider"].Properties["phase"]
	var out []string
	for _, v := range phase.Enum {
		var s string
		require.NoError(t, yaml.Unmarshal(v.Raw, &s))
		out = append(out, s)
	}
	return out
}
