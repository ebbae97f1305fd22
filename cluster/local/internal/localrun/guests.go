package localrun

import (
	"context"
	"fmt"
	"io"
	"path/filepath"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/harness/guesthost"
	"github.com/virtfleet/virtfleet/internal/harness/guestimage"
	"github.com/virtfleet/virtfleet/internal/harness/stack"
)

// GuestsQEMU asks for one real-guest node beside the simulated ones.
const GuestsQEMU = "qemu"

// The real-guest node, the label that keeps the examples off it, and the
// guest made on it.
const (
	qemuNode        = "qemu1"
	hypervisorLabel = "virtfleet.io/hypervisor"
	guestName       = "guest"
	guestNamespace  = "default"
	guestCIDR       = "10.231.9.0/24"
)

// realGuests is the real-guest node of a run: a libvirtd with QEMU in its
// own network namespace, the image served to it, and the guest's key.
type realGuests struct {
	host  *guesthost.Host
	image *guestimage.Served
	key   string
}

// startRealGuestHost builds (once) the guest image and starts the hypervisor.
func startRealGuestHost(ctx context.Context, o Options) (*realGuests, error) {
	if _, err := guestimage.Ensure(ctx, o.Out); err != nil {
		return nil, err
	}
	h, err := guesthost.Start(ctx, "vfrun", o.Out)
	if err != nil {
		return nil, err
	}
	return &realGuests{host: h}, nil
}

// stackOptions puts the real node beside the simulated ones; the simulated
// nodes' label is the default selector, so the examples never land on the
// real node, whose guest would not boot their images.
func (g *realGuests) stackOptions(so *stack.Options) {
	so.Nodes = []string{"node1", "node2", "node3", qemuNode}
	so.LibvirtHosts = map[string]stack.LibvirtHost{qemuNode: {Socket: g.host.Socket, URI: g.host.URI, Pool: guesthost.Pool, DomainType: guesthost.DomainType, ConsoleLocalDir: g.host.LibDir("qemu")}}
	so.Labels = map[string]map[string]string{qemuNode: {hypervisorLabel: "qemu"}}
	for _, n := range so.Nodes[:3] {
		so.Labels[n] = map[string]string{hypervisorLabel: "test"}
	}
	so.DefaultNodeSelector = map[string]string{hypervisorLabel: "test"}
	// The real guest can be backed up (libvirt's test driver has no
	// backup API): the stack's own S3 store is its location.
	so.ObjectStore = true
}

// createGuest serves the image, writes the guest's key pair into the run
// directory and creates the image, network, boot volume and VM.
func (g *realGuests) createGuest(ctx context.Context, kube client.Client, dir string) error {
	image, err := guestimage.Path()
	if err != nil {
		return err
	}
	if g.image, err = guestimage.Serve(image); err != nil {
		return err
	}
	g.key = filepath.Join(dir, "guest_ed25519")
	pub, err := guestimage.NewKey(g.key, "virtfleet make run guest")
	if err != nil {
		return err
	}
	qcow2 := v1alpha1.DiskFormatQCOW2
	swap := resource.MustParse("256Mi")
	objs := []client.Object{
		&v1alpha1.DiskImage{
			ObjectMeta: metav1.ObjectMeta{Namespace: guestNamespace, Name: "debian-guest"},
			Spec: v1alpha1.DiskImageSpec{ForProvider: v1alpha1.DiskImageParameters{
				Source: v1alpha1.DiskImageSource{URL: g.image.URL, SHA256: g.image.SHA256}, Format: &qcow2,
			}},
		},
		&v1alpha1.VirtualNetwork{
			ObjectMeta: metav1.ObjectMeta{Namespace: guestNamespace, Name: "net-guest"},
			Spec:       v1alpha1.VirtualNetworkSpec{ForProvider: v1alpha1.VirtualNetworkParameters{Mode: v1alpha1.NetworkModeNAT, CIDR: guestCIDR}},
		},
		&v1alpha1.Volume{
			ObjectMeta: metav1.ObjectMeta{Namespace: guestNamespace, Name: guestName + "-root"},
			Spec: v1alpha1.VolumeSpec{ForProvider: v1alpha1.VolumeParameters{
				Size:   resource.MustParse("4Gi"),
				Source: &v1alpha1.VolumeSource{DiskImageRef: &v1alpha1.LocalReference{Name: "debian-guest"}},
			}},
		},
		&v1alpha1.VirtualMachine{
			ObjectMeta: metav1.ObjectMeta{Namespace: guestNamespace, Name: guestName},
			Spec: v1alpha1.VirtualMachineSpec{ForProvider: v1alpha1.VirtualMachineParameters{
				Running:         ptr.To(true),
				Vcpu:            1,
				Memory:          resource.MustParse("1Gi"),
				Swap:            &swap,
				PublicKey:       pub,
				NodeSelector:    map[string]string{hypervisorLabel: "qemu"},
				VirtualNetworks: []v1alpha1.LocalName{"net-guest"},
				DiskAttachments: []v1alpha1.DiskAttachment{{Name: guestName + "-root"}},
			}},
		},
	}
	for _, o := range objs {
		if err := kube.Create(ctx, o); err != nil {
			return errors.Wrapf(err, "cannot create %s %s", o.GetObjectKind().GroupVersionKind().Kind, o.GetName())
		}
	}
	return nil
}

// summary tells the user how to reach the guest.
func (g *realGuests) summary(w io.Writer, kubectl string) {
	fmt.Fprintf(w, "\nReal guest: VM %s/%s boots Debian on node %s (QEMU, libvirtd in network namespace %s).\n", guestNamespace, guestName, qemuNode, g.host.Netns)
	fmt.Fprintf(w, "It takes a few minutes without KVM; then its address shows in `kubectl get vm %s -o wide`. To log in:\n\n", guestName)
	fmt.Fprintf(w, "  ip=$(%s get vm %s -o jsonpath='{.status.atProvider.interfaces[0].ips[0]}')\n", kubectl, guestName)
	fmt.Fprintf(w, "  sudo ip netns exec %s ssh -i %s -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null %s@$ip\n", g.host.Netns, g.key, guestimage.DefaultUser)
}

func (g *realGuests) stop() {
	if g.image != nil {
		g.image.Close()
	}
	g.host.Stop()
}
