// Command pause is the sandbox process of a test node's pods (containerd's
// sandbox_image; there is no internet to pull registry.k8s.io/pause from),
// and the program of the pods a test runs there.
//
// Without flags it does what Kubernetes' pause does for a sandbox: it holds
// the pod's namespaces, sleeping until SIGTERM or SIGINT. With -exit it
// writes -say to standard output and exits with that status at once, a
// run-to-completion container whose status and log tell that it ran. With
// -serve it answers every TCP connection on that address with -say until
// stopped; with -dial it connects to that address, retrying for a minute,
// and writes what it read to its termination message and exits 0, or
// exits 1 saying why it could not.
package main

import (
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"
)

// terminationLog is where the kubelet reads a container's termination
// message from, unless its spec says another path.
const terminationLog = "/dev/termination-log"

func main() {
	exit := flag.Int("exit", -1, "Exit at once with this status (0-255) instead of sleeping.")
	say := flag.String("say", "", "What to write to standard output before exiting (with -exit), or to each connection (with -serve).")
	serve := flag.String("serve", "", "Answer each TCP connection on this address with -say.")
	dial := flag.String("dial", "", "Connect to this TCP address, write what it sends to the termination message and exit.")
	flag.Parse()
	switch {
	case *exit >= 0:
		fmt.Println(*say)
		os.Exit(*exit)
	case *dial != "":
		got, err := read(*dial)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		if err := os.WriteFile(terminationLog, got, 0o644); err != nil { //nolint:gosec // the kubelet's file
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	case *serve != "":
		l, err := net.Listen("tcp", *serve)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		go answer(l, *say)
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	<-stop
}

// answer writes say to each connection l accepts, and closes it.
func answer(l net.Listener, say string) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		_, _ = io.WriteString(c, say)
		_ = c.Close()
	}
}

// read connects to addr, retrying for a minute (a Service's rules may come
// after the pod starts), and returns what it sends until it closes.
func read(addr string) ([]byte, error) {
	var err error
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(time.Second) {
		var c net.Conn
		if c, err = net.DialTimeout("tcp", addr, 5*time.Second); err != nil {
			continue
		}
		defer c.Close() //nolint:errcheck // read only
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		return io.ReadAll(c)
	}
	return nil, err
}
