// Package compose is virtfleet's composition function: it turns one
// VirtualMachine-shaped composite resource (a size class or an explicit vcpu
// and memory, a DiskImage, networks, a public key and extra disks) into a
// virtfleet VirtualMachine, its boot Volume cloned from the DiskImage and one
// Volume per extra disk, and copies the VM's phase, node and addresses back
// to the composite's status, where a claim shows them too.
//
// The same function serves both shapes Crossplane v2 users write: a
// namespaced composite (the composed resources go to its namespace, named
// after it) and a claim of a legacy cluster-scoped composite (they go to the
// claim's namespace, named after the claim, so `kubectl get vm` in that
// namespace shows the name the user chose).
package compose

import (
	"context"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/crossplane/function-sdk-go/logging"
	fnv1 "github.com/crossplane/function-sdk-go/proto/v1"
	"github.com/crossplane/function-sdk-go/request"
	fnresource "github.com/crossplane/function-sdk-go/resource"
	"github.com/crossplane/function-sdk-go/resource/composed"
	"github.com/crossplane/function-sdk-go/response"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"

	computev1alpha1 "github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
)

// Names of the composed resources within the pipeline (not their
// metadata.name). A data disk is DiskPrefix + its name.
const (
	ResourceVM   fnresource.Name = "vm"
	ResourceBoot fnresource.Name = "boot-volume"
	DiskPrefix                   = "disk-"
)

// Labels Crossplane puts on a composite created for a claim.
const (
	labelClaimName      = "crossplane.io/claim-name"
	labelClaimNamespace = "crossplane.io/claim-namespace"
)

// Spec is what a composite asks for: the spec of the XRDs in
// package/configuration.
type Spec struct {
	// Size names one of the size classes (Sizes). VCPU and Memory, when set,
	// override it.
	Size   string             `json:"size,omitempty"`
	VCPU   int32              `json:"vcpu,omitempty"`
	Memory *resource.Quantity `json:"memory,omitempty"`
	// Running is the desired power state; unset means running.
	Running *bool `json:"running,omitempty"`
	// Image names the DiskImage the boot Volume is cloned from.
	Image        string             `json:"image"`
	BootDiskSize *resource.Quantity `json:"bootDiskSize,omitempty"`
	Networks     []string           `json:"networks,omitempty"`
	PublicKey    string             `json:"publicKey,omitempty"`
	// Disks are extra data Volumes, attached after the boot Volume.
	Disks []Disk `json:"disks,omitempty"`
	// RestartRequestedAt restarts the VM once per value, as the VM's
	// compute.virtfleet.io/restart-requested-at annotation does.
	RestartRequestedAt string `json:"restartRequestedAt,omitempty"`
}

// Disk is one extra data Volume.
type Disk struct {
	Name string            `json:"name"`
	Size resource.Quantity `json:"size"`
}

// Status is what the function reports on the composite.
type Status struct {
	Phase           string `json:"phase,omitempty"`
	Node            string `json:"node,omitempty"`
	IP              string `json:"ip,omitempty"`
	RestartCount    int32  `json:"restartCount,omitempty"`
	RestartRequired bool   `json:"restartRequired,omitempty"`
	VCPU            int32  `json:"vcpu,omitempty"`
	Memory          string `json:"memory,omitempty"`
}

// Function is the composition function's gRPC service.
type Function struct {
	fnv1.UnimplementedFunctionRunnerServiceServer

	Log logging.Logger
}

func init() {
	// composed.From sets apiVersion and kind from this scheme.
	if err := computev1alpha1.AddToScheme(composed.Scheme); err != nil {
		panic(err)
	}
}

// RunFunction composes one VM. A request the function cannot satisfy (an
// unknown size, no image, no size classes) is a fatal result: Crossplane shows it on the
// composite and its claim and composes nothing.
func (f *Function) RunFunction(_ context.Context, req *fnv1.RunFunctionRequest) (*fnv1.RunFunctionResponse, error) {
	rsp := response.To(req, response.DefaultTTL)

	in, err := sizesOf(req)
	if err != nil {
		response.Fatal(rsp, err)
		return rsp, nil
	}
	oxr, err := request.GetObservedCompositeResource(req)
	if err != nil {
		response.Fatal(rsp, errors.Wrap(err, "cannot read the composite resource"))
		return rsp, nil
	}
	spec := Spec{}
	if err := oxr.Resource.GetValueInto("spec", &spec); err != nil {
		response.Fatal(rsp, errors.Wrap(err, "cannot read the composite's spec"))
		return rsp, nil
	}
	shape, err := in.shape(spec)
	if err != nil {
		response.Fatal(rsp, err)
		return rsp, nil
	}
	if spec.Image == "" {
		response.Fatal(rsp, errors.New("spec.image is required: the name of a DiskImage to boot from"))
		return rsp, nil
	}

	target := targetOf(oxr.Resource.GetName(), oxr.Resource.GetNamespace(), oxr.Resource.GetLabels())
	if f.Log != nil {
		f.Log.Debug("Composing a VirtualMachine", "composite", oxr.Resource.GetName(), "namespace", target.Namespace, "name", target.Name, "vcpu", shape.VCPU, "memory", shape.Memory.String())
	}
	desired, err := request.GetDesiredComposedResources(req)
	if err != nil {
		response.Fatal(rsp, errors.Wrap(err, "cannot read the desired composed resources"))
		return rsp, nil
	}
	resources, err := compose(target, spec, shape, in.bootDiskSize(spec))
	if err != nil {
		response.Fatal(rsp, err)
		return rsp, nil
	}
	observed, err := request.GetObservedComposedResources(req)
	if err != nil {
		response.Fatal(rsp, errors.Wrap(err, "cannot read the observed composed resources"))
		return rsp, nil
	}
	for n, o := range resources {
		cd, err := composed.From(o)
		if err != nil {
			response.Fatal(rsp, errors.Wrapf(err, "cannot compose %s", n))
			return rsp, nil
		}
		// The typed objects carry an empty status; a desired status would
		// only be dropped by the API server.
		delete(cd.Object, "status")
		// Ready as the hub says: the composite (and its claim) is Ready when
		// its VM and Volumes are.
		ready := fnresource.ReadyFalse
		if ob, ok := observed[n]; ok && ob.Resource.GetCondition(xpv2.TypeReady).Status == corev1.ConditionTrue {
			ready = fnresource.ReadyTrue
		}
		desired[n] = &fnresource.DesiredComposed{Resource: cd, Ready: ready}
	}
	if err := response.SetDesiredComposedResources(rsp, desired); err != nil {
		response.Fatal(rsp, errors.Wrap(err, "cannot set the desired composed resources"))
		return rsp, nil
	}

	status := Status{VCPU: shape.VCPU, Memory: shape.Memory.String()}
	if vm, ok := observed[ResourceVM]; ok {
		if err := observedStatus(vm.Resource, &status); err != nil {
			response.Fatal(rsp, err)
			return rsp, nil
		}
	}
	dxr, err := request.GetDesiredCompositeResource(req)
	if err != nil {
		response.Fatal(rsp, errors.Wrap(err, "cannot read the desired composite resource"))
		return rsp, nil
	}
	st, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&status)
	if err != nil {
		response.Fatal(rsp, errors.Wrap(err, "cannot convert the status"))
		return rsp, nil
	}
	if err := dxr.Resource.SetValue("status", st); err != nil {
		response.Fatal(rsp, errors.Wrap(err, "cannot set the composite's status"))
		return rsp, nil
	}
	if err := response.SetDesiredCompositeResource(rsp, dxr); err != nil {
		response.Fatal(rsp, errors.Wrap(err, "cannot set the desired composite resource"))
		return rsp, nil
	}
	return rsp, nil
}

// shape is the vcpu and memory spec asks for: the named size class (or the
// default one), overridden by an explicit vcpu or memory.
func (in *Sizes) shape(spec Spec) (Size, error) {
	name := spec.Size
	if name == "" {
		name = in.DefaultSize
	}
	s := Size{}
	if name != "" {
		var ok bool
		if s, ok = in.Sizes[name]; !ok {
			known := make([]string, 0, len(in.Sizes))
			for k := range in.Sizes {
				known = append(known, k)
			}
			slices.Sort(known)
			return Size{}, errors.Errorf("unknown size %q: this platform offers %v", name, known)
		}
	}
	if spec.VCPU > 0 {
		s.VCPU = spec.VCPU
	}
	if spec.Memory != nil {
		s.Memory = *spec.Memory
	}
	if s.VCPU < 1 || s.Memory.Sign() <= 0 {
		return Size{}, errors.New("name a size in spec.size, or give both spec.vcpu and spec.memory")
	}
	return s, nil
}

func (in *Sizes) bootDiskSize(spec Spec) resource.Quantity {
	switch {
	case spec.BootDiskSize != nil:
		return *spec.BootDiskSize
	case in.BootDiskSize != nil:
		return *in.BootDiskSize
	default:
		return resource.MustParse("10Gi")
	}
}

// target is where the composed resources go and the name they derive from.
type target struct {
	Namespace, Name string
}

// targetOf is the composite's own namespace and name for a namespaced
// composite, and the claim's for a claim's cluster-scoped composite: the
// composed resources belong with what the user applied.
func targetOf(name, namespace string, labels map[string]string) target {
	if namespace != "" {
		return target{Namespace: namespace, Name: name}
	}
	if cn, cns := labels[labelClaimName], labels[labelClaimNamespace]; cn != "" && cns != "" {
		return target{Namespace: cns, Name: cn}
	}
	// A cluster-scoped composite applied directly: namespaced managed
	// resources still need a namespace.
	return target{Namespace: "default", Name: name}
}

// BootVolumeName and DiskVolumeName are the names of the composed Volumes.
func BootVolumeName(vm string) string       { return vm + "-boot" }
func DiskVolumeName(vm, disk string) string { return vm + "-" + disk }

func compose(t target, spec Spec, shape Size, bootSize resource.Quantity) (map[fnresource.Name]runtime.Object, error) {
	out := map[fnresource.Name]runtime.Object{}
	meta := func(name string) metav1.ObjectMeta {
		return metav1.ObjectMeta{Namespace: t.Namespace, Name: name}
	}
	boot := BootVolumeName(t.Name)
	out[ResourceBoot] = &computev1alpha1.Volume{
		ObjectMeta: meta(boot),
		Spec: computev1alpha1.VolumeSpec{ForProvider: computev1alpha1.VolumeParameters{
			Size:   bootSize,
			Source: &computev1alpha1.VolumeSource{DiskImageRef: &computev1alpha1.LocalReference{Name: computev1alpha1.LocalName(spec.Image)}},
		}},
	}
	attach := []computev1alpha1.DiskAttachment{{Name: computev1alpha1.LocalName(boot)}}
	for _, d := range spec.Disks {
		if d.Name == "" {
			return nil, errors.New("every entry of spec.disks needs a name")
		}
		n := fnresource.Name(DiskPrefix + d.Name)
		if _, dup := out[n]; dup {
			return nil, errors.Errorf("disk %q is listed twice", d.Name)
		}
		name := DiskVolumeName(t.Name, d.Name)
		out[n] = &computev1alpha1.Volume{
			ObjectMeta: meta(name),
			Spec:       computev1alpha1.VolumeSpec{ForProvider: computev1alpha1.VolumeParameters{Size: d.Size}},
		}
		attach = append(attach, computev1alpha1.DiskAttachment{Name: computev1alpha1.LocalName(name)})
	}
	networks := make([]computev1alpha1.LocalName, 0, len(spec.Networks))
	for _, n := range spec.Networks {
		networks = append(networks, computev1alpha1.LocalName(n))
	}
	vm := &computev1alpha1.VirtualMachine{
		ObjectMeta: meta(t.Name),
		Spec: computev1alpha1.VirtualMachineSpec{ForProvider: computev1alpha1.VirtualMachineParameters{
			Running:         spec.Running,
			Vcpu:            shape.VCPU,
			Memory:          shape.Memory,
			PublicKey:       spec.PublicKey,
			VirtualNetworks: networks,
			DiskAttachments: attach,
		}},
	}
	if spec.RestartRequestedAt != "" {
		vm.Annotations = map[string]string{computev1alpha1.AnnotationRestartRequestedAt: spec.RestartRequestedAt}
	}
	out[ResourceVM] = vm
	return out, nil
}

// observedStatus copies what the hub observed of the VM to status.
func observedStatus(vm *composed.Unstructured, status *Status) error {
	obs := computev1alpha1.VirtualMachineObservation{}
	if err := vm.GetValueInto("status.atProvider", &obs); err != nil {
		// No status yet: the hub has not seen the VM.
		return nil //nolint:nilerr // a missing status is not an error
	}
	status.Phase = string(obs.Phase)
	status.Node = obs.Node
	status.IP = obs.IP
	status.RestartCount = obs.RestartCount
	status.RestartRequired = obs.RestartRequired
	return nil
}
