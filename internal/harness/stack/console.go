package stack

import (
	"bytes"
	"context"
	"io"
	"os/exec"
	"sync"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
)

// Console is kubectl virtfleet console of one VM, run as the cluster's
// administrator and driven as a script drives it: what is sent goes to the
// plugin's standard input, and what it prints (the guest's output and the
// plugin's errors) collects for Output.
type Console struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   output
	done  chan error
}

// OpenConsole starts the plugin's console of VM namespace/name; it runs
// until Leave or ctx ends.
func (s *Stack) OpenConsole(ctx context.Context, namespace, name string) (*Console, error) {
	c := &Console{done: make(chan error, 1)}
	c.cmd = exec.CommandContext(ctx, s.Plugin(), "--kubeconfig", s.ControlPlane.Kubeconfig, "-n", namespace, "console", name) //nolint:gosec // our own binary
	c.cmd.Stdout, c.cmd.Stderr = &c.out, &c.out
	var err error
	if c.stdin, err = c.cmd.StdinPipe(); err != nil {
		return nil, errors.Wrap(err, "cannot connect to the plugin's input")
	}
	if err := c.cmd.Start(); err != nil {
		return nil, errors.Wrap(err, "cannot start the plugin")
	}
	go func() { c.done <- c.cmd.Wait() }()
	return c, nil
}

// Send types text on the console.
func (c *Console) Send(text string) error {
	_, err := io.WriteString(c.stdin, text)
	return errors.Wrap(err, "cannot type on the console")
}

// Output is what the plugin printed so far.
func (c *Console) Output() string { return c.out.String() }

// Leave ends the plugin's input, as a script's end does, and waits up to
// timeout for the plugin to leave: its error is the plugin's exit, or that
// it did not leave (it is killed then).
func (c *Console) Leave(timeout time.Duration) error {
	_ = c.stdin.Close()
	select {
	case err := <-c.done:
		return errors.Wrapf(err, "the plugin failed: %s", c.Output())
	case <-time.After(timeout):
		_ = c.cmd.Process.Kill()
		<-c.done
		return errors.Errorf("the plugin did not leave within %s of its input's end", timeout)
	}
}

// output collects what a process writes, for conditions to look at while
// it runs.
type output struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (o *output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.Write(p)
}

func (o *output) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.String()
}
