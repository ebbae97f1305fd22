package kubenode

import (
	"net"
	"runtime"
	"strconv"

	"github.com/vishvananda/netns"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/internal/harness/relay"
)

// forward makes 127.0.0.1:port of the machine reachable on the same port
// of every address of the network namespace at nsPath: what runs in the
// node (the kubelet, containerd) reaches the API server and the registry at
// the loopback addresses their URLs and image references name, its pods
// (which have a loopback of their own) reach them at NodeIP, and no traffic
// leaves loopback or the node's namespace. Cut stops it.
func forward(nsPath string, port int) (*relay.Relay, error) {
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	l, err := listenIn(nsPath, net.JoinHostPort("", strconv.Itoa(port)))
	if err != nil {
		return nil, err
	}
	r := relay.New(func() (net.Conn, error) { return net.Dial("tcp", addr) })
	r.Serve(l)
	return r, nil
}

// PodsReach is where the node's pods reach hostPort, an address on the
// machine's loopback whose port the node forwards (Options.Forward): the
// same port at NodeIP. A reference to an image of a registry there, in
// the host part, is one a pod can pull from (Crossplane's package
// manager), and the node's containerd pulls it too (Options.Registries).
func PodsReach(hostPort string) string {
	_, port, err := net.SplitHostPort(hostPort)
	if err != nil {
		return hostPort
	}
	return net.JoinHostPort(NodeIP, port)
}

// Expose makes addr, an address inside the node's network namespace (a
// pod's IP and port), reachable on a port of the machine's loopback,
// which it returns as host:port, until the node stops: what a test dials
// where it stands in for a workload of another node (the hub, reaching
// NATS). Workloads on the node reach a Service through the cluster's DNS
// and kube-proxy, which work inside the node's namespace only; the test's
// process is outside it, and the API server cannot reach the kubelet's
// streaming server for a port-forward.
func (n *Node) Expose(addr string) (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", errors.Wrap(err, "cannot listen on the machine's loopback")
	}
	r := relay.New(func() (net.Conn, error) { return n.Dial(addr) })
	r.Serve(l)
	n.forwardsMu.Lock()
	defer n.forwardsMu.Unlock()
	n.forwards = append(n.forwards, r)
	return l.Addr().String(), nil
}

// Dial connects to addr (host:port) from inside the node's network
// namespace, where its pods' addresses are.
func (n *Node) Dial(addr string) (net.Conn, error) {
	var c net.Conn
	err := inNetns(n.NetnsPath, func() (err error) {
		c, err = net.Dial("tcp", addr)
		return errors.Wrapf(err, "cannot dial %s in %s", addr, n.NetnsPath)
	})
	if err != nil && c != nil {
		_ = c.Close() // made in the namespace, but the thread is lost
	}
	return c, err
}

// listenIn listens on addr inside the network namespace at nsPath.
func listenIn(nsPath, addr string) (net.Listener, error) {
	var l net.Listener
	err := inNetns(nsPath, func() (err error) {
		l, err = net.Listen("tcp", addr)
		return errors.Wrapf(err, "cannot listen on %s in %s", addr, nsPath)
	})
	if err != nil && l != nil {
		_ = l.Close() // made in the namespace, but the thread is lost
	}
	return l, err
}

// inNetns calls f on a thread switched into the network namespace at
// nsPath: the sockets f makes stay in that namespace. The thread is
// switched back, and given up if it cannot be.
func inNetns(nsPath string, f func() error) error {
	runtime.LockOSThread()
	restored := false
	defer func() {
		if restored {
			runtime.UnlockOSThread()
		}
	}()
	here, err := netns.Get()
	if err != nil {
		restored = true
		return errors.Wrap(err, "cannot open this thread's network namespace")
	}
	defer func() { _ = here.Close() }()
	there, err := netns.GetFromPath(nsPath)
	if err != nil {
		restored = true
		return errors.Wrapf(err, "cannot open network namespace %s", nsPath)
	}
	defer func() { _ = there.Close() }()
	if err := netns.Set(there); err != nil {
		restored = true
		return errors.Wrapf(err, "cannot enter network namespace %s", nsPath)
	}
	ferr := f()
	if err := netns.Set(here); err != nil {
		return errors.Wrap(err, "cannot return to this thread's network namespace")
	}
	restored = true
	return ferr
}
