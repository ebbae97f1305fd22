package s3test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/virtfleet/virtfleet/internal/harness/procs"
)

// process is one weed, in a process group of its own.
type process struct {
	cmd    *exec.Cmd
	log    *os.File
	from   int64 // where this start's part of the log begins
	done   chan struct{}
	err    error
	record *procs.Record // in RunDir, held for as long as p runs
	rec    record
}

// record names a running weed in RunDir (a procs.Record, which the run
// that started weed holds). Its start time (in clock ticks since boot, as
// /proc has it) tells the process from a later one given the same pid.
type record struct {
	PID     int      `json:"pid"`
	Start   uint64   `json:"start"`
	Dir     string   `json:"dir"`
	Sockets []string `json:"sockets"`
}

// launch starts weed with ports p in dir, its output appended to dir's log,
// and records it in runDir.
func launch(bin, dir, runDir string, p ports, attempt int) (*process, error) {
	log, err := os.OpenFile(filepath.Join(dir, logName), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644) //nolint:gosec // our own log
	if err != nil {
		return nil, errors.Wrap(err, "cannot open weed's log")
	}
	from, err := log.Seek(0, io.SeekEnd)
	if err != nil {
		_ = log.Close()
		return nil, errors.Wrap(err, "cannot read weed's log")
	}
	args := p.args(dir)
	fmt.Fprintf(log, "=== start %d: %s %s\n", attempt, bin, strings.Join(args, " "))
	cmd := exec.Command(bin, args...) //nolint:gosec // the harness's own command line
	cmd.Dir = dir                     // weed reads master.toml and the like from here first
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		_ = log.Close()
		return nil, errors.Wrap(err, "cannot start weed")
	}
	proc := &process{cmd: cmd, log: log, from: from, done: make(chan struct{})}
	go func() {
		proc.err = cmd.Wait()
		close(proc.done)
	}()
	proc.rec = record{PID: cmd.Process.Pid, Dir: dir, Sockets: p.sockets()}
	st, err := procs.Read(proc.rec.PID)
	if err != nil {
		proc.stop()
		return nil, err
	}
	proc.rec.Start = st.Start
	if proc.record, err = procs.WriteRecord(runDir, strconv.Itoa(proc.rec.PID), proc.rec); err != nil {
		proc.stop()
		return nil, err
	}
	return proc, nil
}

// stop kills p's process group and removes what it leaves. SIGKILL at
// once: weed server stops its volume server before its filer, whose last
// flush then waits for a volume that never comes back (measured: still
// retrying 5 s after SIGTERM), and everything it wrote already sits in the
// kernel's page cache, which outlives the process.
func (p *process) stop() {
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
	_ = p.log.Close()
	removeAll(p.rec.Sockets)
	if p.record != nil {
		p.record.Remove()
	}
}

// portTaken reports whether weed's log says, since p started, that a port
// was taken.
func (p *process) portTaken() bool {
	b, _ := os.ReadFile(p.log.Name()) //nolint:gosec // our own log
	return bytes.Contains(b[min(p.from, int64(len(b))):], []byte("address already in use"))
}

// exited reports whether p has stopped.
func (p *process) exited() error {
	select {
	case <-p.done:
		return errors.Errorf("weed exited: %v", p.err)
	default:
		return nil
	}
}

// killLeftovers kills every weed recorded in runDir by a run that is
// gone, a test binary killed before it stopped its servers, and removes
// the sockets those weed processes left once nothing answers on them: a
// killed weed's threads may hold them a moment after its main thread is
// gone, and a running weed may have been given one of the same ports
// since, and so have a socket of the same name, which stays.
func killLeftovers(ctx context.Context, runDir string, progress io.Writer) error {
	return procs.RemoveAbandoned(runDir, func(rec record) error {
		if err := killLeftover(ctx, rec, progress); err != nil {
			return err
		}
		for _, s := range rec.Sockets {
			err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
				c, err := net.Dial("unix", s)
				if err == nil {
					_ = c.Close()
				}
				return err != nil, nil
			})
			if err == nil {
				_ = os.Remove(s)
			}
		}
		return nil
	})
}

// killLeftover kills rec's weed, if it still runs, and waits until it is
// gone.
func killLeftover(ctx context.Context, rec record, progress io.Writer) error {
	if !procs.Alive(rec.PID, rec.Start) {
		return nil
	}
	fmt.Fprintf(progress, "seaweedfs: killing weed (pid %d, dir %s) that a killed run left behind\n", rec.PID, rec.Dir)
	if err := syscall.Kill(-rec.PID, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return errors.Wrapf(err, "cannot kill weed (pid %d) that a killed run left behind", rec.PID)
	}
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return !procs.Alive(rec.PID, rec.Start), nil
	})
	return errors.Wrapf(err, "weed (pid %d) that a killed run left behind did not die", rec.PID)
}

// removeAll removes files that need not exist.
func removeAll(paths []string) {
	for _, p := range paths {
		_ = os.Remove(p)
	}
}
