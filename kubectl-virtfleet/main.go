// Command kubectl-virtfleet is kubectl's virtfleet plugin: a VirtualMachine's
// serial console and VNC display, and its start, stop, restart, reset,
// pause, unpause and migrate, through the hub's aggregated API
// (subresources.virtfleet.io), authorized by the cluster's RBAC.
//
//	go install github.com/virtfleet/virtfleet/kubectl-virtfleet@latest
//	kubectl virtfleet console my-vm
package main

import (
	"os"

	"github.com/virtfleet/virtfleet/kubectl-virtfleet/internal/plugin"
)

func main() {
	os.Exit(plugin.Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}
