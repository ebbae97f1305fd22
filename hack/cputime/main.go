// Command cputime runs a test binary and prints, when it ends, the CPU time
// it and every process it started used: `go test -exec "$PWD/bin/cputime"`
// (make test-cpu). Wall time says little about a package on a machine whose
// cores every package shares; CPU time says what each costs. It makes
// itself the child subreaper, so that daemons which detach from the test
// binary (QEMU under libvirtd, a daemonized dnsmasq) are reaped, and
// counted, here.
package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: cputime BINARY [ARGS...]")
		os.Exit(2)
	}
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		fmt.Fprintln(os.Stderr, "cputime: cannot become the child subreaper:", err)
	}
	cmd := exec.Command(os.Args[1], os.Args[2:]...) //nolint:gosec // runs what go test gives it
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	start := time.Now()
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "cputime:", err)
		os.Exit(1)
	}
	// go test's own timeout and ^C reach the test binary through here.
	signals := make(chan os.Signal, 4)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGQUIT)
	go func() {
		for s := range signals {
			_ = cmd.Process.Signal(s)
		}
	}()
	code := reap(cmd.Process.Pid)
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_CHILDREN, &ru); err == nil {
		user, sys := time.Duration(ru.Utime.Nano()), time.Duration(ru.Stime.Nano())
		fmt.Fprintf(os.Stderr, "cputime: %s: %.1f s CPU (user %.1f, system %.1f) in %.1f s, max RSS %d MiB\n",
			filepath.Base(os.Args[1]), (user + sys).Seconds(), user.Seconds(), sys.Seconds(), time.Since(start).Seconds(), ru.Maxrss>>10)
	}
	os.Exit(code)
}

// reap waits for every child, the orphans it inherits included, until the
// test binary pid has exited, and returns its exit code.
func reap(pid int) int {
	code := -1
	for {
		var ws unix.WaitStatus
		got, err := unix.Wait4(-1, &ws, 0, nil)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			return code // no child left
		case got == pid:
			code = ws.ExitStatus()
			if ws.Signaled() {
				code = 128 + int(ws.Signal())
			}
			return code
		}
	}
}
