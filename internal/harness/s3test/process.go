package s3test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
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
	record string // its record's file in RunDir
	rec    record
}

// record names a running weed and the process that started it, in RunDir.
// Start times (in clock ticks since boot, as /proc has them) tell a
// process from a later one that was given the same pid.
type record struct {
	PID        int      `json:"pid"`
	Start      uint64   `json:"start"`
	Owner      int      `json:"owner"`
	OwnerStart uint64   `json:"ownerStart"`
	Dir        string   `json:"dir"`
	Sockets    []string `json:"sockets"`
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
	proc.rec = record{PID: cmd.Process.Pid, Owner: os.Getpid(), Dir: dir, Sockets: p.sockets()}
	var errs [2]error
	var stats [2]procs.Stat
	stats[0], errs[0] = procs.Read(proc.rec.PID)
	stats[1], errs[1] = procs.Read(proc.rec.Owner)
	proc.rec.Start, proc.rec.OwnerStart = stats[0].Start, stats[1].Start
	if err := errors.Join(errs[:]...); err != nil {
		proc.stop()
		return nil, err
	}
	proc.record = filepath.Join(runDir, strconv.Itoa(proc.rec.PID)+".json")
	if err := writeRecord(proc.record, proc.rec); err != nil {
		proc.stop()
		return nil, err
	}
	return proc, nil
}

// writeRecord writes rec to path through a temporary file renamed at the
// end, so that a concurrent Start never reads half a record.
func writeRecord(path string, rec record) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return errors.Wrap(err, "cannot encode weed's record")
	}
	f, err := os.CreateTemp(filepath.Dir(path), ".record-")
	if err != nil {
		return errors.Wrap(err, "cannot create weed's record")
	}
	_, err = f.Write(b)
	if err = errors.Join(err, f.Close()); err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		_ = os.Remove(f.Name())
		return errors.Wrap(err, "cannot write weed's record")
	}
	return nil
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
	if p.record != "" {
		_ = os.Remove(p.record)
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

// killLeftovers kills every weed recorded in runDir whose starter is gone,
// a test binary that was killed before it stopped its servers, and removes
// what those weed processes left.
func killLeftovers(ctx context.Context, runDir string, progress io.Writer) error {
	paths, err := filepath.Glob(filepath.Join(runDir, "*.json"))
	if err != nil {
		return errors.Wrap(err, "cannot list weed's records")
	}
	inUse := map[string]bool{}
	left := map[string]record{}
	for _, path := range paths {
		rec, err := readRecord(path)
		switch {
		case errors.Is(err, os.ErrNotExist): // stopped meanwhile
		case err != nil:
			return err
		case procs.Alive(rec.Owner, rec.OwnerStart):
			for _, s := range rec.Sockets {
				inUse[s] = true
			}
		default:
			left[path] = rec
		}
	}
	for path, rec := range left {
		if err := killLeftover(ctx, rec, progress); err != nil {
			return err
		}
		// A running weed may have been given one of its ports, and
		// so have a socket of the same name.
		for _, s := range rec.Sockets {
			if !inUse[s] {
				_ = os.Remove(s)
			}
		}
		_ = os.Remove(path)
	}
	return nil
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

func readRecord(path string) (record, error) {
	var rec record
	b, err := os.ReadFile(path) //nolint:gosec // a record in our run directory
	if err != nil {
		return rec, errors.Wrap(err, "cannot read weed's record")
	}
	return rec, errors.Wrapf(json.Unmarshal(b, &rec), "cannot parse weed's record %s", path)
}

// removeAll removes files that need not exist.
func removeAll(paths []string) {
	for _, p := range paths {
		_ = os.Remove(p)
	}
}
