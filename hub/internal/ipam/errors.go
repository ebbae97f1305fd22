package ipam

import (
	"fmt"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
)

// InvalidAddressError says that a VirtualMachine fixes an address its network
// can never give it: not an IPv4 address, outside the network's cidr, or one
// of the three the network keeps for itself. No retry mends it; changing the
// VM's spec.forProvider.addresses or the network's cidr does.
type InvalidAddressError struct {
	// Network is the VirtualNetwork's name.
	Network string
	// CIDR is the network's cidr.
	CIDR string
	// Address is the address the VM asked for, as written.
	Address string
	// Reason says why the network cannot give it.
	Reason string
}

func (e *InvalidAddressError) Error() string {
	return fmt.Sprintf("spec.forProvider.addresses: %s is not an address VirtualNetwork %s gives VMs: %s", e.Address, e.Network, e.Reason)
}

// InvalidNetworkError says that a VirtualNetwork has no addresses to give:
// no cidr, or one without room for a VM. No retry mends it; changing the
// network's spec.forProvider.cidr does.
type InvalidNetworkError struct {
	// Network is the VirtualNetwork's name.
	Network string
	// CIDR is its spec.forProvider.cidr, as written.
	CIDR string
	// Reason says what is wrong with it.
	Reason string
}

func (e *InvalidNetworkError) Error() string {
	return fmt.Sprintf("VirtualNetwork %s: spec.forProvider.cidr %q %s", e.Network, e.CIDR, e.Reason)
}

// HeldError says that the address a VirtualMachine fixes is another VM's.
// It is not terminal: the address becomes free when its holder is deleted or
// moves to another address.
type HeldError struct {
	// Network is the VirtualNetwork's name.
	Network string
	// Address is the address asked for.
	Address string
	// VirtualMachine is the name of the VM holding it; empty when the
	// record that holds it could not be read.
	VirtualMachine string
}

func (e *HeldError) Error() string {
	holder := "another VirtualMachine"
	if e.VirtualMachine != "" {
		holder = "VirtualMachine " + e.VirtualMachine
	}
	return fmt.Sprintf("address %s of network %s is held by %s", e.Address, e.Network, holder)
}

// ExhaustedError says that every address of a network is given to a VM. It
// is not terminal: an address becomes free when a VM on the network is
// deleted.
type ExhaustedError struct {
	// Network is the VirtualNetwork's name.
	Network string
	// Allocated and Total count the network's addresses given to VMs and
	// all it can give.
	Allocated, Total int
}

func (e *ExhaustedError) Error() string {
	return fmt.Sprintf("network %s has no free address (%d of %d allocated)", e.Network, e.Allocated, e.Total)
}

// IsTerminal reports whether err, or an error it wraps, is one no retry
// mends: an InvalidAddressError or an InvalidNetworkError.
func IsTerminal(err error) bool {
	var a *InvalidAddressError
	var n *InvalidNetworkError
	return errors.As(err, &a) || errors.As(err, &n)
}
