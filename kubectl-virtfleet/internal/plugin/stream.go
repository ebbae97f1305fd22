package plugin

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"

	"github.com/virtfleet/virtfleet/internal/wsconsole"
)

// subprotocol is the stream's WebSocket subprotocol (binary messages carry
// the bytes as they are).
const subprotocol = "plain.virtfleet.io"

// escape ends an interactive console, as in telnet and virsh console: Ctrl+].
const escape = 0x1d

var statusCodecs = clientgoscheme.Codecs.WithoutConversion()

func (e *env) consoleCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "console NAME",
		Short: "Connect to a VirtualMachine's serial console (Ctrl+] leaves)",
		Long: "Connect to a running VirtualMachine's serial console through the Kubernetes API.\n" +
			"On a terminal, keys go to the guest as typed; Ctrl+] leaves. Otherwise standard input\n" +
			"goes to the guest until it ends, and the console's output goes to standard output.",
		Args:              exactlyOneVM,
		ValidArgsFunction: e.completeVMs,
		RunE: func(cmd *cobra.Command, args []string) error {
			conn, err := e.dial(cmd.Context(), args[0], "console")
			if err != nil {
				return err
			}
			defer conn.Close() //nolint:errcheck // leaving
			in := e.in
			if e.interactiveTTY() {
				f := e.in.(*os.File) //nolint:forcetypeassert // isTerminal said so
				old, err := term.MakeRaw(int(f.Fd()))
				if err != nil {
					return fmt.Errorf("cannot put the terminal in raw mode: %w", err)
				}
				defer term.Restore(int(f.Fd()), old) //nolint:errcheck // best effort on the way out
				fmt.Fprintf(e.errOut, "Connected to %s's serial console (Ctrl+] leaves).\r\n", args[0])
				in = untilEscape{f}
			}
			return pipe(cmd.Context(), conn, in, e.out)
		},
	}
}

func (e *env) vncCommand() *cobra.Command {
	var address string
	var port int
	cmd := &cobra.Command{
		Use:   "vnc NAME",
		Short: "Open a local port that reaches a VirtualMachine's VNC display",
		Long: "Listen on a local port and relay each VNC viewer that connects there to the\n" +
			"VirtualMachine's display, through the Kubernetes API. Runs until interrupted.",
		Args:              exactlyOneVM,
		ValidArgsFunction: e.completeVMs,
		RunE: func(cmd *cobra.Command, args []string) error {
			// Fail early, with the API's reason, when the display cannot be
			// had at all (no such VM, not running, not allowed).
			probe, err := e.dial(cmd.Context(), args[0], "vnc")
			if err != nil {
				return err
			}
			_ = probe.Close()
			l, err := net.Listen("tcp", net.JoinHostPort(address, fmt.Sprint(port)))
			if err != nil {
				return fmt.Errorf("cannot listen for a VNC viewer: %w", err)
			}
			defer l.Close() //nolint:errcheck // leaving
			fmt.Fprintf(e.out, "VNC of %s on %s (point a VNC viewer there; Ctrl+C stops)\n", args[0], l.Addr())
			go func() {
				<-cmd.Context().Done()
				_ = l.Close()
			}()
			for {
				c, err := l.Accept()
				if err != nil {
					if cmd.Context().Err() != nil {
						return nil
					}
					return err
				}
				go func() {
					defer c.Close() //nolint:errcheck // the viewer left
					conn, err := e.dial(cmd.Context(), args[0], "vnc")
					if err != nil {
						fmt.Fprintln(e.errOut, "error:", message(err))
						return
					}
					defer conn.Close() //nolint:errcheck // as above
					_ = pipe(cmd.Context(), conn, c, c)
				}()
			}
		},
	}
	cmd.Flags().StringVar(&address, "address", "127.0.0.1", "Local address to listen on.")
	cmd.Flags().IntVar(&port, "port", 0, "Local port to listen on; 0 picks a free one.")
	return cmd
}

// dial opens the WebSocket of stream sub of VM name through the API
// server, authenticated as the kubeconfig says.
func (e *env) dial(ctx context.Context, name, sub string) (*wsconsole.Stream, error) {
	cfg, ns, err := e.rest()
	if err != nil {
		return nil, err
	}
	u, err := url.Parse(cfg.Host)
	if err != nil {
		return nil, fmt.Errorf("cannot parse the API server's address: %w", err)
	}
	u.Path = strings.TrimSuffix(u.Path, "/") + subresourcePath(ns, name, sub)
	u = wsconsole.KubeURL(u)
	o, err := wsconsole.KubeOptions(cfg, u, subprotocol)
	if err != nil {
		return nil, err
	}
	s, err := wsconsole.Dial(ctx, u, o)
	var refused *wsconsole.RefusedError
	if errors.As(err, &refused) {
		// The API's reason (its Status message): not found, forbidden,
		// not running.
		st := &metav1.Status{}
		if json.Unmarshal(refused.Body, st) == nil && st.Message != "" {
			return nil, errors.New(st.Message)
		}
	}
	return s, err
}

// pipe copies in to the stream and the stream to out until the stream
// ends or ctx does. When in ends first, the stream is half-closed and what
// the server still sends before it closes is written out.
func pipe(ctx context.Context, s *wsconsole.Stream, in io.Reader, out io.Writer) error {
	received := make(chan error, 1)
	go func() {
		_, err := io.Copy(out, s)
		received <- err
	}()
	sent := make(chan error, 1)
	go func() {
		_, err := io.Copy(s, in)
		sent <- err
	}()
	select {
	case err := <-received:
		return err
	case <-ctx.Done():
		return nil
	case err := <-sent:
		// The input ended: say goodbye; the server closes its side.
		_ = s.CloseWrite()
		select {
		case rerr := <-received:
			return cmp.Or(err, rerr)
		case <-time.After(closeWait):
			return err
		case <-ctx.Done():
			return err
		}
	}
}

// closeWait is how long the server has to close a stream whose input ended.
const closeWait = 5 * time.Second

// untilEscape reads a terminal until the escape key.
type untilEscape struct{ f *os.File }

func (u untilEscape) Read(p []byte) (int, error) {
	n, err := u.f.Read(p)
	for i := 0; i < n; i++ {
		if p[i] == escape {
			return i, io.EOF
		}
	}
	return n, err
}

func isTerminal(in io.Reader) bool {
	f, ok := in.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}
