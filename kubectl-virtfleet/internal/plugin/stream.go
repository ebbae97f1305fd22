package plugin

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"time"

	"github.com/gorilla/websocket"
	"github.com/spf13/cobra"
	"golang.org/x/term"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
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
func (e *env) dial(ctx context.Context, name, sub string) (*websocket.Conn, error) {
	cfg, ns, err := e.rest()
	if err != nil {
		return nil, err
	}
	u, err := url.Parse(cfg.Host)
	if err != nil {
		return nil, fmt.Errorf("cannot parse the API server's address: %w", err)
	}
	u.Scheme = map[string]string{"http": "ws", "https": "wss"}[u.Scheme]
	if u.Scheme == "" {
		u.Scheme = "wss"
	}
	u.Path = subresourcePath(ns, name, sub)
	tlsConfig, err := rest.TLSConfigFor(cfg)
	if err != nil {
		return nil, err
	}
	headers, err := authHeaders(cfg, u)
	if err != nil {
		return nil, err
	}
	d := websocket.Dialer{TLSClientConfig: tlsConfig, Subprotocols: []string{subprotocol}, Proxy: http.ProxyFromEnvironment}
	conn, resp, err := d.DialContext(ctx, u.String(), headers)
	if err != nil {
		return nil, handshakeError(err, resp)
	}
	return conn, nil
}

// authHeaders are the headers client-go would authenticate a request to u
// with (a bearer token, basic auth, an exec plugin's token); client
// certificates are in the TLS configuration.
func authHeaders(cfg *rest.Config, u *url.URL) (http.Header, error) {
	var got http.Header
	rt, err := rest.HTTPWrappersForConfig(cfg, roundTripper(func(r *http.Request) (*http.Response, error) {
		got = r.Header.Clone()
		return &http.Response{StatusCode: http.StatusNoContent, Body: http.NoBody, Request: r}, nil
	}))
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequest(http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, err
	}
	resp, err := rt.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	_ = resp.Body.Close()
	return got, nil
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// handshakeError is the API's reason for refusing the stream (its Status
// message), or the dial error itself.
func handshakeError(err error, resp *http.Response) error {
	if resp == nil {
		return err
	}
	defer resp.Body.Close() //nolint:errcheck // read once
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	st := &metav1.Status{}
	if json.Unmarshal(body, st) == nil && st.Message != "" {
		return fmt.Errorf("%s", st.Message)
	}
	return fmt.Errorf("%w (%s)", err, resp.Status)
}

// pipe copies in to the WebSocket and the WebSocket to out until the
// stream ends or ctx does. When in ends first, the stream is closed and
// what the server still sends before it closes is written out.
func pipe(ctx context.Context, conn *websocket.Conn, in io.Reader, out io.Writer) error {
	received := make(chan error, 1)
	go func() {
		for {
			_, data, err := conn.ReadMessage()
			if err != nil {
				if websocket.IsCloseError(err, websocket.CloseNormalClosure) {
					err = nil
				}
				received <- err
				return
			}
			if _, err := out.Write(data); err != nil {
				received <- err
				return
			}
		}
	}()
	sent := make(chan error, 1)
	go func() {
		buf := make([]byte, 32<<10)
		for {
			n, err := in.Read(buf)
			if n > 0 {
				if werr := conn.WriteMessage(websocket.BinaryMessage, buf[:n]); werr != nil {
					sent <- werr
					return
				}
			}
			if err != nil {
				if err == io.EOF { //nolint:errorlint // io.Reader's contract
					err = nil
				}
				sent <- err
				return
			}
		}
	}()
	select {
	case err := <-received:
		return err
	case <-ctx.Done():
		return nil
	case err := <-sent:
		// The input ended: say goodbye; the server closes its side.
		_ = conn.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(time.Second))
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
