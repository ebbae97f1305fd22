// Command mint-agent-credentials mints a NATS identity for one node's agent:
// it writes the secret nkey seed to <node>.nk (give it to that agent only)
// and prints the entry to add to the nats-server "authorization" users list.
//
//	go run ./hack/mint-agent-credentials node1
package main

import (
	"fmt"
	"os"

	"github.com/virtfleet/virtfleet/internal/natsauth"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: mint-agent-credentials <node>")
		os.Exit(2)
	}
	id, err := natsauth.NewAgentIdentity(os.Args[1])
	if err == nil {
		err = os.WriteFile(os.Args[1]+".nk", id.Seed, 0o600)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Print(id.ServerConfigEntry())
}
