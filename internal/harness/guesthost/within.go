package guesthost

import (
	"runtime"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"golang.org/x/sys/unix"
)

// Within runs f on a thread moved into the network namespace at path (a
// Host's NetnsPath), and moves the thread back afterwards: a socket f
// makes belongs to that namespace wherever it is used later, so a test or
// the benchmark can reach a guest from its own process. A thread left
// there could make the process count as one of the namespace's (when it
// is the main thread, which never exits), and Stop kills those.
func Within(path string, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		back, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- errors.Wrap(err, "cannot open the thread's network namespace")
			return
		}
		defer func() { _ = unix.Close(back) }()
		target, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- errors.Wrapf(err, "cannot open network namespace %s", path)
			return
		}
		defer func() { _ = unix.Close(target) }()
		if err := unix.Setns(target, unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- errors.Wrapf(err, "cannot enter network namespace %s", path)
			return
		}
		err = f()
		if berr := unix.Setns(back, unix.CLONE_NEWNET); berr != nil {
			// Left locked: the runtime ends the thread with this goroutine
			// instead of running others in the wrong namespace.
			errc <- errors.Join(err, errors.Wrap(berr, "cannot leave the network namespace"))
			return
		}
		runtime.UnlockOSThread()
		errc <- err
	}()
	return <-errc
}
