package stack

import (
	"cmp"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
)

// component is a running hub or agent process.
type component struct {
	name string
	cmd  *exec.Cmd
	done chan error
	// exited is closed once the process is gone, with its error in err;
	// unlike done it can be asked any number of times.
	exited chan struct{}
	err    error
	log    *os.File
	// grace is how long it has to stop after SIGTERM; zero is stopGrace.
	grace time.Duration
}

// How long a component has to stop after SIGTERM (Kubernetes' default grace
// period), and then to print its goroutines after SIGQUIT.
const (
	stopGrace = 30 * time.Second
	dumpGrace = 10 * time.Second
)

// stop sends sig and waits for the process; SIGTERM is a clean stop, SIGKILL
// a crash. A process still there its grace after SIGTERM gets SIGQUIT, on
// which Go prints every goroutine into its log and exits, so the log says
// where it hung; then it is killed.
func (c *component) stop(sig syscall.Signal) error {
	_ = c.cmd.Process.Signal(sig)
	grace := cmp.Or(c.grace, stopGrace)
	var err error
	select {
	case err = <-c.done:
	case <-time.After(grace):
		_ = c.cmd.Process.Signal(syscall.SIGQUIT)
		select {
		case <-c.done:
		case <-time.After(dumpGrace):
			_ = c.cmd.Process.Kill()
			<-c.done
		}
		err = errors.Errorf("still running %s after %s; its goroutines are in %s (SIGQUIT)", grace, sig, c.log.Name())
	}
	_ = c.log.Close()
	if sig == syscall.SIGKILL {
		return nil // the point was to crash it
	}
	return errors.Wrapf(err, "%s did not stop cleanly", c.name)
}

// run starts one of the built binaries with its output in logs/name.log.
func (s *Stack) run(name, binary string, env []string, args ...string) (*component, error) {
	return s.runCommand(name, append([]string{s.Binary(binary)}, args...), env)
}

// fleetNice is the niceness Options.FleetFirst gives the fleet's
// processes: ahead of the control plane's, which run at 0.
const fleetNice = -10

// fleetArgv is argv run at fleetNice when Options.FleetFirst asks for it.
// nice(1) sets the niceness before it execs argv, so every thread the
// process starts has it, and the process id stays argv's.
func (s *Stack) fleetArgv(argv []string) []string {
	if !s.opts.FleetFirst {
		return argv
	}
	return append([]string{"nice", "-n", strconv.Itoa(fleetNice)}, argv...)
}

// runCommand starts argv with its output in logs/name.log.
func (s *Stack) runCommand(name string, argv, env []string) (*component, error) {
	f, err := os.OpenFile(s.LogPath(name), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, errors.Wrapf(err, "cannot open the log of %s", name)
	}
	cmd := exec.Command(argv[0], argv[1:]...) //nolint:gosec // our own binaries
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = append(os.Environ(), env...)
	// Never outlive the stack, even if the test binary dies.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = f.Close()
		return nil, errors.Wrapf(err, "cannot start %s", name)
	}
	c := &component{name: name, cmd: cmd, done: make(chan error, 1), exited: make(chan struct{}), log: f}
	go func() {
		c.err = cmd.Wait()
		close(c.exited)
		c.done <- c.err
	}()
	return c, nil
}

// gone says why c's process is no longer running, with the end of its
// log, or returns nil while it runs.
func (c *component) gone() error {
	select {
	case <-c.exited:
		return errors.Errorf("%s exited (%v); the end of its log:\n%s", c.name, c.err, tail(c.log.Name(), 20))
	default:
		return nil
	}
}

// tail is the last n lines of the file at path.
func tail(path string, n int) string {
	b, err := os.ReadFile(path) //nolint:gosec // the stack's own log
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(len(lines)-n, 0):], "\n")
}
