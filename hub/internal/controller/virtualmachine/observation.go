package virtualmachine

import (
	"cmp"
	"net/netip"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
)

// apiPhase is the status phase of a reported one (see driver.Phases). A node
// newer than this hub may report a phase the API does not know; it shows as
// Unknown rather than failing the status write on the CRD's enum.
func apiPhase(p wire.Phase) v1alpha1.Phase {
	if a := v1alpha1.Phase(p); slices.Contains(v1alpha1.Phases, a) {
		return a
	}
	return v1alpha1.PhaseUnknown
}

// observation turns a node's report into status.atProvider. networks is
// spec.forProvider.virtualNetworks: the ip summary follows its order, so the
// column reads the same way the user wrote the spec.
func observation(r wire.Report, networks []v1alpha1.LocalName) v1alpha1.VirtualMachineObservation {
	o := v1alpha1.VirtualMachineObservation{
		ID:                 r.ID,
		Phase:              apiPhase(r.Phase),
		Node:               cmp.Or(r.Host, r.Node),
		IP:                 ipSummary(r.Interfaces, networks),
		RestartCount:       r.RestartCount,
		ObservedGeneration: r.ObservedGeneration,
		RestartRequired:    r.RestartRequired,
		Vcpu:               r.VCPU,
		MaxVcpu:            r.MaxVCPU,
	}
	if r.MemoryBytes > 0 {
		o.Memory = resource.NewQuantity(r.MemoryBytes, resource.BinarySI)
	}
	o.Disks = append([]string(nil), r.Disks...)
	if r.MaxMemoryBytes > 0 {
		o.MaxMemory = resource.NewQuantity(r.MaxMemoryBytes, resource.BinarySI)
	}
	for _, i := range r.Interfaces {
		s := v1alpha1.InterfaceStatus{
			Network: i.Network,
			MAC:     i.MAC,
			IPs:     append([]string(nil), i.IPs...),
			Source:  v1alpha1.AddressSource(i.Source),
		}
		if !i.LastSeen.IsZero() {
			t := metav1.NewTime(i.LastSeen)
			s.LastSeen = &t
		}
		o.Interfaces = append(o.Interfaces, s)
	}
	return o
}

// ipSummary renders the seed's NETWORKS(IP) format,
// "net-db(10.10.120.21), net-backend(10.10.150.12)": one address per network
// in spec order, IPv4 preferred. A network without a known address is left
// out rather than shown with a guess; the interfaces list has the details.
func ipSummary(ifaces []wire.Interface, networks []v1alpha1.LocalName) string {
	byNetwork := map[string][]string{}
	for _, i := range ifaces {
		byNetwork[i.Network] = append(byNetwork[i.Network], i.IPs...)
	}
	parts := make([]string, 0, len(networks))
	for _, n := range networks {
		if ip := preferredIP(byNetwork[string(n)]); ip != "" {
			parts = append(parts, string(n)+"("+ip+")")
		}
	}
	return strings.Join(parts, ", ")
}

// preferredIP picks the first IPv4 address, else the first address at all.
func preferredIP(ips []string) string {
	for _, ip := range ips {
		if a, err := netip.ParseAddr(ip); err == nil && a.Is4() {
			return ip
		}
	}
	if len(ips) > 0 {
		return ips[0]
	}
	return ""
}

// declared is the shape vm asks for (status.atProvider.declared); nil for
// a VM whose instance type is not recorded yet.
func declared(vm *v1alpha1.VirtualMachine) *v1alpha1.Shape {
	vcpu, memory, ok := vm.Shape()
	if !ok {
		return nil
	}
	maxVCPU, maxMemory := vm.MaxShape()
	memory = memory.DeepCopy()
	s := &v1alpha1.Shape{Vcpu: vcpu, Memory: &memory, MaxVcpu: maxVCPU}
	if maxMemory != nil {
		m := maxMemory.DeepCopy()
		s.MaxMemory = &m
	}
	return s
}
