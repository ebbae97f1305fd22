package openstack

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/prometheus/procfs"
	"k8s.io/apimachinery/pkg/util/wait"
)

// stopGrace is how long a service has to stop after SIGTERM before its
// process group is killed.
const stopGrace = 10 * time.Second

// process is one service, run in a process group of its own so that its
// forked workers stop with it.
type process struct {
	name string
	cmd  *exec.Cmd
	log  *os.File
	done chan struct{}
	err  error
}

// python is Debian's interpreter: the OpenStack packages live in its
// dist-packages, which a pyenv python earlier on PATH does not see.
const python = "/usr/bin/python3"

// start runs argv with env added to a clean environment, its output in
// <dir>/logs/<name>.log.
func (c *Cloud) start(name string, env []string, argv ...string) (*process, error) {
	log, err := os.Create(filepath.Join(c.Dir, "logs", name+".log"))
	if err != nil {
		return nil, errors.Wrapf(err, "cannot create the log of %s", name)
	}
	cmd := exec.Command(argv[0], argv[1:]...) //nolint:gosec // the harness's own command lines
	cmd.Env = append(c.baseEnv(), env...)
	cmd.Dir = c.Dir
	cmd.Stdout, cmd.Stderr = log, log
	// A test binary killed before its TestMain stops the cloud takes the
	// services' parents with it; what they started and outlives them, the
	// next Start removes (leftovers.go).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = log.Close()
		return nil, errors.Wrapf(err, "cannot start %s", name)
	}
	p := &process{name: name, cmd: cmd, log: log, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	c.mu.Lock()
	c.procs = append(c.procs, p)
	c.mu.Unlock()
	c.progress("started %s (pid %d)", name, cmd.Process.Pid)
	return p, nil
}

// baseEnv is what every service sees: no proxy, no pyenv, a HOME in the
// cloud's directory (RabbitMQ's Erlang cookie, Python's caches), and a
// PYTHONPATH with the harness's ML2 mechanism driver.
func (c *Cloud) baseEnv() []string {
	return []string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME=" + filepath.Join(c.Dir, "home"),
		"LANG=C.UTF-8",
		"PYTHONPATH=" + filepath.Join(c.Dir, "python"),
		"XDG_CACHE_HOME=" + filepath.Join(c.Dir, "home", ".cache"),
	}
}

// run runs a one-shot command (a db sync, a bootstrap) to completion.
func (c *Cloud) run(ctx context.Context, name string, argv ...string) error {
	start := time.Now()
	log, err := os.Create(filepath.Join(c.Dir, "logs", name+".log"))
	if err != nil {
		return errors.Wrapf(err, "cannot create the log of %s", name)
	}
	defer func() { _ = log.Close() }()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...) //nolint:gosec // the harness's own command lines
	cmd.Env = c.baseEnv()
	cmd.Dir = c.Dir
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Run(); err != nil {
		return errors.Errorf("%s failed (%v); see %s", name, err, log.Name())
	}
	c.progress("%s done in %s", name, time.Since(start).Round(100*time.Millisecond))
	return nil
}

// stop stops p's process group: SIGTERM, then SIGKILL after stopGrace.
func (p *process) stop() {
	pgid := -p.cmd.Process.Pid
	_ = syscall.Kill(pgid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(stopGrace):
	}
	// Workers that outlived their parent, or a parent that ignored SIGTERM.
	_ = syscall.Kill(pgid, syscall.SIGKILL)
	<-p.done
	_ = p.log.Close()
}

// exited reports whether p has stopped, with the end of its log.
func (p *process) exited() error {
	select {
	case <-p.done:
		return errors.Errorf("%s exited (%v); the end of its log:\n%s", p.name, p.err, tail(p.log.Name(), 20))
	default:
		return nil
	}
}

// cpu is the CPU time p's process has used (its own, not its children's),
// or zero when /proc cannot say.
func (p *process) cpu() time.Duration {
	proc, err := procfs.NewProc(p.cmd.Process.Pid)
	if err != nil {
		return 0
	}
	st, err := proc.Stat()
	if err != nil {
		return 0
	}
	return time.Duration(st.CPUTime() * float64(time.Second))
}

// tail is the last n lines of a file.
func tail(path string, n int) string {
	b, _ := os.ReadFile(path) //nolint:gosec // the harness's own log
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(len(lines)-n, 0):], "\n")
}

// wallFactor bounds a wait for a process by wall time too: timeout times
// this, for one that waits on something else without using its CPU.
const wallFactor = 4

// waitFor polls cond every half second until it holds or p exits. With a
// process it gives up once p has used timeout of its own CPU time, or after
// wallFactor times timeout: on a loaded machine an OpenStack service takes
// minutes of wall time to import its modules (eight of them start at once,
// beside the rest of the suite) while needing only seconds of CPU, so a wall
// timeout alone fails a service that is merely slow. Without a process,
// timeout is of wall time.
func (c *Cloud) waitFor(ctx context.Context, what string, p *process, timeout time.Duration, cond func(context.Context) bool) error {
	wall := timeout
	if p != nil {
		wall = wallFactor * timeout
	}
	return c.waitWithin(ctx, what, p, timeout, wall, cond)
}

// waitWithin is waitFor with the wall bound given.
func (c *Cloud) waitWithin(ctx context.Context, what string, p *process, timeout, wall time.Duration, cond func(context.Context) bool) error {
	start := time.Now()
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, wall, true, func(ctx context.Context) (bool, error) {
		if p == nil {
			return cond(ctx), nil
		}
		if err := p.exited(); err != nil {
			return false, err
		}
		if cond(ctx) {
			return true, nil
		}
		if used := p.cpu(); used > timeout {
			return false, errors.Errorf("%s not ready after %s of its own CPU time", what, used.Round(time.Second))
		}
		return false, nil
	})
	if err != nil {
		if p != nil {
			if perr := p.exited(); perr != nil {
				return perr
			}
			return errors.Errorf("%s not ready after %s (%s of its own CPU time; %v); the end of %s:\n%s",
				what, time.Since(start).Round(time.Second), p.cpu().Round(time.Second), err, p.log.Name(), tail(p.log.Name(), 20))
		}
		return errors.Wrapf(err, "%s not ready after %s", what, timeout)
	}
	c.progress("%s ready after %s", what, time.Since(start).Round(100*time.Millisecond))
	return nil
}

// answers reports whether an HTTP endpoint answers at all: any status means
// the service is up.
func answers(ctx context.Context, url string) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	_ = resp.Body.Close()
	return resp.StatusCode < 500
}

// listens reports whether something accepts TCP connections on port.
func listens(port int) bool {
	conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second)
	if err != nil {
		return false
	}
	_ = conn.Close()
	return true
}
