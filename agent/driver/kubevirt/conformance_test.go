package kubevirt

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/virtfleet/virtfleet/internal/harness/drivertest"
)

// TestConformance runs the driver conformance suite against the shared
// KubeVirt test cluster, each case in a namespace of its own, where the
// cluster's stand-in controller moves guests through their phases.
func TestConformance(t *testing.T) {
	drivertest.Run(t, drivertest.Harness{
		Start: func(t *testing.T) drivertest.Backend {
			e := newEnv(t)
			return drivertest.Backend{
				Driver:  e.d,
				Machine: e.machine,
				// A VirtualMachine of the namespace someone other than
				// virtfleet made.
				AddForeign: func(t *testing.T) {
					theirs := &kubevirtv1.VirtualMachine{
						ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: "hand-made"},
						Spec: kubevirtv1.VirtualMachineSpec{
							RunStrategy: ptr(kubevirtv1.RunStrategyHalted), Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{},
						},
					}
					require.NoError(t, e.kube.Create(context.Background(), theirs))
				},
			}
		},
		// ensureUntil's pace: the stand-in controller and the driver's
		// informers each take a round trip through the API server.
		Wait: 20 * time.Second, Tick: 50 * time.Millisecond,
		Unsupported: map[drivertest.Capability]string{
			drivertest.Images: "the kubevirt driver keeps no images and is no driver.ImageKeeper: CDI imports each disk from an image into its own PVC",
		},
	})
}
