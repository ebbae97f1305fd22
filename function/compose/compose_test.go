package compose

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/runtime"

	fnv1 "github.com/crossplane/function-sdk-go/proto/v1"
	fnresource "github.com/crossplane/function-sdk-go/resource"

	computev1alpha1 "github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
)

// sizes is the size classes' EnvironmentConfig as Crossplane passes it to
// the step that requires it.
const sizes = `{
	"apiVersion": "apiextensions.crossplane.io/v1beta1",
	"kind": "EnvironmentConfig",
	"metadata": {"name": "virtfleet-sizes"},
	"data": {
		"defaultSize": "small",
		"bootDiskSize": "8Gi",
		"sizes": {
			"small": {"vcpu": 1, "memory": "512Mi"},
			"medium": {"vcpu": 2, "memory": "2Gi"}
		}
	}
}`

// withSizes is the required resources of a step that requires sizes.
func withSizes() map[string]*fnv1.Resources {
	return map[string]*fnv1.Resources{RequirementSizes: {Items: []*fnv1.Resource{{Resource: fnresource.MustStructJSON(sizes)}}}}
}

// namespacedXR is a namespaced composite as Crossplane v2 sends it.
const namespacedXR = `{
	"apiVersion": "platform.virtfleet.io/v1alpha1",
	"kind": "VirtualMachine",
	"metadata": {"name": "web-1", "namespace": "team-a"},
	"spec": {
		"size": "medium",
		"image": "debian-12",
		"networks": ["net-frontend"],
		"publicKey": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPhz15bJpUHuPq3LwmxcCns+GW1WBNOHXZnedSmqZEhL admin@example.com",
		"disks": [{"name": "data", "size": "20Gi"}],
		"crossplane": {"compositionRef": {"name": "x"}}
	}
}`

// claimXR is the cluster-scoped composite of a claim named db-1 in team-b.
const claimXR = `{
	"apiVersion": "platform.virtfleet.io/v1alpha1",
	"kind": "XVirtualMachine",
	"metadata": {"name": "db-1-x7k2p", "labels": {"crossplane.io/claim-name": "db-1", "crossplane.io/claim-namespace": "team-b"}},
	"spec": {"image": "debian-12", "vcpu": 4, "restartRequestedAt": "2026-11-23T14:00:00Z", "claimRef": {"name": "db-1", "namespace": "team-b"}}
}`

func run(t *testing.T, xr string, observed map[string]string) *fnv1.RunFunctionResponse {
	t.Helper()
	return runRequired(t, xr, observed, withSizes())
}

func runRequired(t *testing.T, xr string, observed map[string]string, required map[string]*fnv1.Resources) *fnv1.RunFunctionResponse {
	t.Helper()
	req := &fnv1.RunFunctionRequest{
		RequiredResources: required,
		Observed:          &fnv1.State{Composite: &fnv1.Resource{Resource: fnresource.MustStructJSON(xr)}, Resources: map[string]*fnv1.Resource{}},
		Desired:           &fnv1.State{},
	}
	for n, o := range observed {
		req.Observed.Resources[n] = &fnv1.Resource{Resource: fnresource.MustStructJSON(o)}
	}
	rsp, err := (&Function{}).RunFunction(context.Background(), req)
	require.NoError(t, err)
	return rsp
}

// desired decodes the desired composed resource n into a typed object.
func desired[T any](t *testing.T, rsp *fnv1.RunFunctionResponse, n fnresource.Name) *T {
	t.Helper()
	r, ok := rsp.GetDesired().GetResources()[string(n)]
	require.Truef(t, ok, "no desired resource %s; results: %v", n, rsp.GetResults())
	out := new(T)
	require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(r.GetResource().AsMap(), out))
	return out
}

func TestComposeNamespacedComposite(t *testing.T) {
	rsp := run(t, namespacedXR, nil)
	require.Empty(t, rsp.GetResults(), "no fatal or warning results")

	vm := desired[computev1alpha1.VirtualMachine](t, rsp, ResourceVM)
	assert.Equal(t, "team-a", vm.Namespace, "composed into the composite's namespace")
	assert.Equal(t, "web-1", vm.Name, "the VM takes the composite's name")
	assert.Equal(t, computev1alpha1.VirtualMachineKind, vm.Kind)
	assert.Equal(t, int32(2), vm.Spec.ForProvider.Vcpu, "medium's vcpu")
	assert.Equal(t, "2Gi", vm.Spec.ForProvider.Memory.String(), "medium's memory")
	assert.Equal(t, []computev1alpha1.DiskAttachment{{Name: "web-1-boot"}, {Name: "web-1-data"}}, vm.Spec.ForProvider.DiskAttachments, "boot first, then the data disks")
	assert.Equal(t, []computev1alpha1.LocalName{"net-frontend"}, vm.Spec.ForProvider.VirtualNetworks)
	assert.Contains(t, vm.Spec.ForProvider.PublicKey, "ssh-ed25519 ")
	assert.Empty(t, vm.Annotations, "no restart asked for")

	boot := desired[computev1alpha1.Volume](t, rsp, ResourceBoot)
	assert.Equal(t, "web-1-boot", boot.Name)
	assert.Equal(t, "team-a", boot.Namespace)
	assert.Equal(t, "8Gi", boot.Spec.ForProvider.Size.String(), "the size classes' boot disk size")
	require.NotNil(t, boot.Spec.ForProvider.Source)
	assert.Equal(t, computev1alpha1.LocalName("debian-12"), boot.Spec.ForProvider.Source.DiskImageRef.Name, "cloned from the image")

	data := desired[computev1alpha1.Volume](t, rsp, DiskPrefix+"data")
	assert.Equal(t, "web-1-data", data.Name)
	assert.Equal(t, "20Gi", data.Spec.ForProvider.Size.String())
	assert.Nil(t, data.Spec.ForProvider.Source, "a data disk starts empty")

	for n, r := range rsp.GetDesired().GetResources() {
		assert.NotContainsf(t, r.GetResource().AsMap(), "status", "%s: a desired status would only be dropped", n)
	}
}

func TestComposeClaim(t *testing.T) {
	rsp := run(t, claimXR, nil)
	require.Empty(t, rsp.GetResults())

	vm := desired[computev1alpha1.VirtualMachine](t, rsp, ResourceVM)
	assert.Equal(t, "team-b", vm.Namespace, "composed into the claim's namespace")
	assert.Equal(t, "db-1", vm.Name, "the VM takes the claim's name, not the composite's")
	assert.Equal(t, int32(4), vm.Spec.ForProvider.Vcpu, "an explicit vcpu overrides the size")
	assert.Equal(t, "512Mi", vm.Spec.ForProvider.Memory.String(), "memory of the default size")
	assert.Equal(t, "2026-11-23T14:00:00Z", vm.Annotations[computev1alpha1.AnnotationRestartRequestedAt], "a restart asked on the claim reaches the VM")
	assert.Len(t, rsp.GetDesired().GetResources(), 2, "the VM and its boot Volume, no data disks")
}

func TestStatusFromObservedVM(t *testing.T) {
	vm := `{
		"apiVersion": "compute.virtfleet.io/v1alpha1", "kind": "VirtualMachine",
		"metadata": {"name": "web-1", "namespace": "team-a"},
		"status": {"atProvider": {"phase": "Running", "node": "node2", "ip": "net-frontend(192.168.122.10)", "restartCount": 1, "restartRequired": true},
			"conditions": [{"type": "Ready", "status": "True", "reason": "Available", "lastTransitionTime": "2026-11-23T14:00:00Z"}]}
	}`
	rsp := run(t, namespacedXR, map[string]string{string(ResourceVM): vm})
	require.Empty(t, rsp.GetResults())

	assert.Equal(t, fnv1.Ready_READY_TRUE, rsp.GetDesired().GetResources()[string(ResourceVM)].GetReady(), "the VM is Ready as the hub says")
	assert.Equal(t, fnv1.Ready_READY_FALSE, rsp.GetDesired().GetResources()[string(ResourceBoot)].GetReady(), "a Volume not yet observed is not")
	st := Status{}
	require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(rsp.GetDesired().GetComposite().GetResource().AsMap()["status"].(map[string]any), &st))
	assert.Equal(t, Status{Phase: "Running", Node: "node2", IP: "net-frontend(192.168.122.10)", RestartCount: 1, RestartRequired: true, VCPU: 2, Memory: "2Gi"}, st)
}

func TestRefusals(t *testing.T) {
	const small = `{"apiVersion":"platform.virtfleet.io/v1alpha1","kind":"VirtualMachine","metadata":{"name":"a","namespace":"n"},"spec":{"size":"small","image":"i"}}`
	cases := map[string]struct {
		xr       string
		required map[string]*fnv1.Resources
		want     string
	}{
		"StepRequiresNoSizes": {
			xr:       small,
			required: map[string]*fnv1.Resources{},
			want:     `the Composition's step requires no "sizes" resource`,
		},
		"NoSizesEnvironmentConfig": {
			xr:       small,
			required: map[string]*fnv1.Resources{RequirementSizes: {}},
			want:     "exactly one EnvironmentConfig; 0 match",
		},
		"UnknownSize": {
			xr:   `{"apiVersion":"platform.virtfleet.io/v1alpha1","kind":"VirtualMachine","metadata":{"name":"a","namespace":"n"},"spec":{"size":"huge","image":"debian-12"}}`,
			want: `unknown size "huge": this platform offers [medium small]`,
		},
		"NoImage": {
			xr:   `{"apiVersion":"platform.virtfleet.io/v1alpha1","kind":"VirtualMachine","metadata":{"name":"a","namespace":"n"},"spec":{"size":"small"}}`,
			want: "spec.image is required",
		},
		"DuplicateDisk": {
			xr:   `{"apiVersion":"platform.virtfleet.io/v1alpha1","kind":"VirtualMachine","metadata":{"name":"a","namespace":"n"},"spec":{"image":"i","disks":[{"name":"d","size":"1Gi"},{"name":"d","size":"2Gi"}]}}`,
			want: `disk "d" is listed twice`,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			required := tc.required
			if required == nil {
				required = withSizes()
			}
			rsp := runRequired(t, tc.xr, nil, required)
			require.Len(t, rsp.GetResults(), 1)
			assert.Equal(t, fnv1.Severity_SEVERITY_FATAL, rsp.GetResults()[0].GetSeverity())
			assert.Contains(t, rsp.GetResults()[0].GetMessage(), tc.want)
			assert.Empty(t, rsp.GetDesired().GetResources(), "nothing composed")
		})
	}
}
