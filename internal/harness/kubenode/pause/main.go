// Command pause is the sandbox process of a test node's pods (containerd's
// sandbox_image; there is no internet to pull registry.k8s.io/pause from),
// and the program of the pods a test runs there.
//
// Without flags it does what Kubernetes' pause does for a sandbox: it holds
// the pod's namespaces, sleeping until SIGTERM or SIGINT. With -exit it
// writes -say to standard output and exits with that status at once, a
// run-to-completion container whose status and log tell that it ran.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	exit := flag.Int("exit", -1, "Exit at once with this status (0-255) instead of sleeping.")
	say := flag.String("say", "", "What to write to standard output before exiting (with -exit).")
	flag.Parse()
	if *exit >= 0 {
		fmt.Println(*say)
		os.Exit(*exit)
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	<-stop
}
