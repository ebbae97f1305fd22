package stack

import (
	"bytes"
	"context"
	"io"
	"os/exec"
	"regexp"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

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
	return StartConsole(exec.CommandContext(ctx, s.Plugin(), "--kubeconfig", s.ControlPlane.Kubeconfig, "-n", namespace, "console", name)) //nolint:gosec // our own binary
}

// StartConsole starts cmd, a kubectl virtfleet console of a VM however it
// is run (the plugin itself, or kubectl finding it on its PATH), as a
// Console.
func StartConsole(cmd *exec.Cmd) (*Console, error) {
	c := &Console{cmd: cmd, done: make(chan error, 1)}
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

// Prompts counts the getty login prompts for host name the console showed.
func (c *Console) Prompts(name string) int {
	prompt := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + ` login: `)
	return len(prompt.FindAllString(c.Output(), -1))
}

// AwaitPrompt waits up to timeout until the console shows getty's login
// prompt for host name, typing a newline every two seconds meanwhile:
// getty prints its prompt once, at boot, before anyone listens, and again
// for each newline. It returns how many prompts it saw.
func (c *Console) AwaitPrompt(ctx context.Context, name string, timeout time.Duration) (int, error) {
	var seen int
	err := wait.PollUntilContextTimeout(ctx, 2*time.Second, timeout, true, func(context.Context) (bool, error) {
		if seen = c.Prompts(name); seen > 0 {
			return true, nil
		}
		return false, c.Send("\r")
	})
	return seen, errors.Wrapf(err, "no login prompt of %s on the console; it showed %q", name, c.Output())
}

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
