// Command mint-agent-credentials mints a NATS identity: for one node's agent,
// or, given the name "hub", for the hub. It writes the secret nkey seed to
// <name>.nk (give it to that agent, or put it in the hub's Secret, only) and
// prints the entry to add to the nats-server "authorization" users list. A
// node is named as Kubernetes names it (spec.nodeName, dots and all); its
// permissions are written for the node's NATS token (wire.NodeToken).
//
//	go run ./hack/mint-agent-credentials node1
//	go run ./hack/mint-agent-credentials ip-10-0-0-1.ec2.internal
//	go run ./hack/mint-agent-credentials hub
package main

import (
	"fmt"
	"os"

	"github.com/virtfleet/virtfleet/internal/natswire"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: mint-agent-credentials <node>|"+natswire.HubName)
		os.Exit(2)
	}
	name := os.Args[1]
	// The hub's name is reserved: a node called "hub" would share its inbox.
	mint := func() (natswire.Identity, error) { return natswire.NewAgentIdentity(name) }
	if name == natswire.HubName {
		mint = natswire.NewHubIdentity
	}
	id, err := mint()
	if err == nil {
		err = os.WriteFile(name+".nk", id.Seed, 0o600)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Print(id.ServerConfigEntry())
}
