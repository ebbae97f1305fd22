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

// listenIn listens on addr inside the network namespace at nsPath. The
// listening socket stays in that namespace; the goroutine's thread is
// switched there and back, and given up if it cannot be switched back.
func listenIn(nsPath, addr string) (net.Listener, error) {
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
		return nil, errors.Wrap(err, "cannot open this thread's network namespace")
	}
	defer func() { _ = here.Close() }()
	there, err := netns.GetFromPath(nsPath)
	if err != nil {
		restored = true
		return nil, errors.Wrapf(err, "cannot open network namespace %s", nsPath)
	}
	defer func() { _ = there.Close() }()
	if err := netns.Set(there); err != nil {
		restored = true
		return nil, errors.Wrapf(err, "cannot enter network namespace %s", nsPath)
	}
	l, lerr := net.Listen("tcp", addr)
	if err := netns.Set(here); err != nil {
		if l != nil {
			_ = l.Close()
		}
		return nil, errors.Wrap(err, "cannot return to this thread's network namespace")
	}
	restored = true
	return l, errors.Wrapf(lerr, "cannot listen on %s in %s", addr, nsPath)
}
