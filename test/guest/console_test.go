package guest

import (
	"bufio"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
)

// plugin is kubectl virtfleet as the cluster's administrator.
func (g *suite) plugin(args ...string) *exec.Cmd {
	cmd := exec.CommandContext(g.ctx, g.s.Plugin(), append([]string{"--kubeconfig", g.s.ControlPlane.Kubeconfig, "-n", ns}, args...)...)
	cmd.Stderr = os.Stderr
	return cmd
}

// console opens the guest's serial console through the API server with the
// plugin, driven as a script would drive it: getty's prompt names the VM's
// host, and a newline makes getty print it again.
func (g *suite) console(name string) func(t *testing.T) {
	return func(t *testing.T) {
		// getty starts on the serial port only after cloud-init's config
		// stage (systemd-user-sessions), which under TCG on a busy machine
		// can end minutes after sshd answers: there is no prompt to ask
		// for until it runs.
		g.sshUntil(t, address(g.get(t, name)), "systemctl is-active serial-getty@ttyS0.service", bootTimeout)
		c, err := g.s.OpenConsole(g.ctx, ns, name)
		require.NoError(t, err)
		defer func() { assert.NoError(t, c.Leave(30*time.Second), "the plugin leaves cleanly when its input ends") }()
		seen, err := c.AwaitPrompt(g.ctx, name, 2*time.Minute)
		require.NoError(t, err, "getty's prompt with the VM's hostname on the console")
		require.NoError(t, c.Send("\r"))
		require.Eventually(t, func() bool { return c.Prompts(name) > seen }, 30*time.Second, 100*time.Millisecond,
			"a newline makes getty print its prompt again; got %q", c.Output())
	}
}

// vnc opens the guest's display with the plugin's local port and reads the
// RFB server's greeting there, as a VNC viewer would.
func (g *suite) vnc(name string) func(t *testing.T) {
	return func(t *testing.T) {
		cmd := g.plugin("vnc", name, "--port", "0")
		stdout, err := cmd.StdoutPipe()
		require.NoError(t, err)
		require.NoError(t, cmd.Start())
		defer func() {
			_ = cmd.Process.Signal(os.Interrupt)
			_ = cmd.Wait()
		}()
		lines := bufio.NewScanner(stdout)
		require.True(t, lines.Scan(), "the plugin says where it listens")
		var addr string
		for _, f := range strings.Fields(lines.Text()) {
			if _, _, err := net.SplitHostPort(f); err == nil {
				addr = f
				break
			}
		}
		require.NotEmpty(t, addr, "an address in %q", lines.Text())
		conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
		require.NoError(t, err, "the plugin listens on %s (%q)", addr, lines.Text())
		defer conn.Close() //nolint:errcheck // the test is over
		require.NoError(t, conn.SetDeadline(time.Now().Add(30*time.Second)))
		greeting := make([]byte, 12)
		_, err = io.ReadFull(conn, greeting)
		require.NoError(t, err)
		assert.Equal(t, "RFB 003.008\n", string(greeting), "the guest's VNC server greets the viewer")
		// The viewer's answer, and the server's security types after it.
		_, err = conn.Write(greeting)
		require.NoError(t, err)
		n := make([]byte, 1)
		_, err = io.ReadFull(conn, n)
		require.NoError(t, err)
		assert.NotZero(t, n[0], "the server offers at least one security type")
	}
}

// pause pauses the guest with the plugin: its vCPUs stop (nothing answers
// ssh), the VM shows Paused and stays so; unpause resumes the same boot,
// and neither is a restart.
func (g *suite) pause(name, bootID string) func(t *testing.T) {
	return func(t *testing.T) {
		ip := address(g.get(t, name))
		out, err := g.plugin("pause", name).Output()
		require.NoError(t, err, string(out))
		g.waitVM(t, name, time.Minute, "Paused", func(v *v1alpha1.VirtualMachine) bool { return v.Status.AtProvider.Phase == v1alpha1.PhasePaused })
		_, err = g.ssh(ip, "true")
		assert.Error(t, err, "a paused guest answers nothing")
		out, err = g.plugin("unpause", name).Output()
		require.NoError(t, err, string(out))
		g.waitVM(t, name, time.Minute, "Running", running)
		f := g.facts(t, ip)
		assert.Equal(t, bootID, f.bootID, "the same boot goes on after the pause")
		assert.Zero(t, g.get(t, name).Status.AtProvider.RestartCount, "a pause is no restart")
	}
}

// reset resets the guest with the plugin: a new boot at once, counted once.
func (g *suite) reset(name string, bootID *string) func(t *testing.T) {
	return func(t *testing.T) {
		out, err := g.plugin("reset", name).Output()
		require.NoError(t, err, string(out))
		v := g.waitVM(t, name, bootTimeout, "restartCount 1, Running with an address", func(v *v1alpha1.VirtualMachine) bool {
			return v.Status.AtProvider.RestartCount >= 1 && running(v) && address(v) != ""
		})
		f := g.facts(t, address(v))
		assert.NotEqual(t, *bootID, f.bootID, "the guest booted again")
		assert.EqualValues(t, 1, g.get(t, name).Status.AtProvider.RestartCount, "one reset, counted once")
		*bootID = f.bootID
	}
}
