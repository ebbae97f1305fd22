package subresources

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"path"
	"sync"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/event"
	"github.com/gorilla/websocket"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/natswire"
	"github.com/virtfleet/virtfleet/internal/wsconsole"
)

// Subprotocol is the WebSocket subprotocol of a console or VNC stream:
// binary messages carry the stream's bytes as they are, both ways.
const Subprotocol = "plain.virtfleet.io"

// ReasonConsoleOpened is the reason of the event a stream leaves on its VM,
// naming the user who opened it.
const ReasonConsoleOpened event.Reason = "ConsoleOpened"

// How long the node has to answer, and the largest message a client may
// send (a terminal's keystrokes and a VNC client's requests are small).
const (
	openTimeout    = 15 * time.Second
	maxClientFrame = 64 << 10
)

// streamKinds are the consoles the stream subresources open.
var streamKinds = map[string]wire.ConsoleKind{"console": wire.ConsoleSerial, "vnc": wire.ConsoleVNC}

var upgrader = websocket.Upgrader{
	Subprotocols: []string{Subprotocol},
	// Only the API server's front proxy reaches this server (authenticated
	// checks its certificate); the browser origin rule does not apply.
	CheckOrigin: func(*http.Request) bool { return true },
}

// stream relays the console or VNC display of a VM between a WebSocket
// and the agent of the VM's node. Everything that can fail is tried before
// the upgrade, so a client gets its error as an API status.
func (s *Server) stream(w http.ResponseWriter, r *http.Request, u user) {
	sub := path.Base(r.URL.Path)
	if !websocket.IsWebSocketUpgrade(r) {
		writeStatus(w, kerrors.NewBadRequest(fmt.Sprintf("virtualmachines/%s is a WebSocket stream: open it with kubectl virtfleet %s", sub, sub)))
		return
	}
	nn := types.NamespacedName{Namespace: r.PathValue("namespace"), Name: r.PathValue("name")}
	vm := &v1alpha1.VirtualMachine{}
	if err := s.kube.Get(r.Context(), nn, vm); err != nil {
		writeStatus(w, apiError(err, nn.Name))
		return
	}
	release, err := s.sessions.take(vm.Namespace)
	if err != nil {
		writeStatus(w, err)
		return
	}
	defer release()
	ctx, cancel := context.WithTimeout(r.Context(), openTimeout)
	remote, err := s.open(ctx, vm, sub)
	cancel()
	if err != nil {
		writeStatus(w, err)
		return
	}
	defer remote.Close() //nolint:errcheck // closing ends the session; nothing to do with its error
	conn, err := upgrader.Upgrade(w, r, nil)
	if err != nil {
		return // the upgrader answered the client
	}
	defer conn.Close() //nolint:errcheck // as above
	s.recorder.Event(vm, event.Normal(ReasonConsoleOpened, fmt.Sprintf("%s opened by %s", sub, u.Name)))
	relay(conn, remote)
}

// sessionSlots are the console sessions a hub replica relays: a fleet's
// worth, and a share of them for each namespace. Without the share, one
// tenant that opens and holds sessions would leave every other tenant's
// console refused until it let go.
type sessionSlots struct {
	mu           sync.Mutex
	limit        int
	perNamespace int
	total        int
	namespaces   map[string]int
}

func newSessionSlots(limit, perNamespace int) *sessionSlots {
	return &sessionSlots{limit: limit, perNamespace: perNamespace, namespaces: map[string]int{}}
}

// take holds a slot for a session of a VM of namespace until release is
// called, or returns the API error (429) that names the limit reached.
func (s *sessionSlots) take(namespace string) (release func(), err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.namespaces[namespace] >= s.perNamespace:
		return nil, kerrors.NewTooManyRequests(fmt.Sprintf("namespace %s holds %d console sessions on this hub, the most one namespace may (--api-console-sessions-per-namespace): close one or try again later", namespace, s.perNamespace), 5)
	case s.total >= s.limit:
		return nil, kerrors.NewTooManyRequests(fmt.Sprintf("this hub relays %d console sessions already (--api-console-sessions): try again later", s.limit), 5)
	}
	s.total++
	s.namespaces[namespace]++
	var once sync.Once
	return func() {
		once.Do(func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.total--
			if s.namespaces[namespace]--; s.namespaces[namespace] == 0 {
				delete(s.namespaces, namespace)
			}
		})
	}, nil
}

// open asks the agent of vm's node for the console of stream subresource
// sub, with the error a client should see when it cannot.
func (s *Server) open(ctx context.Context, vm *v1alpha1.VirtualMachine, sub string) (io.ReadWriteCloser, error) {
	switch p := vm.Status.AtProvider.Phase; p {
	case v1alpha1.PhaseRunning, v1alpha1.PhasePaused:
	default:
		return nil, conflict(vm, fmt.Sprintf("is not running (phase %s): its %s opens once it runs", phaseOrNone(p), sub))
	}
	f, err := s.fleets(ctx, vm)
	if err != nil {
		return nil, kerrors.NewServiceUnavailable(fmt.Sprintf("cannot reach the fleet of VirtualMachine %s: %v", vm.Name, err))
	}
	node := vm.GetAnnotations()[v1alpha1.AnnotationNode]
	if node == "" || !f.Sealed(vm) {
		return nil, conflict(vm, "is not placed on a node by virtfleet")
	}
	open := wire.ConsoleOpen{ProtocolVersion: wire.ProtocolVersion, Session: natswire.NewConsoleSession(), UID: string(vm.UID), Kind: streamKinds[sub], Namespace: vm.Namespace}
	remote, err := f.OpenConsole(ctx, node, open)
	var refused *natswire.ConsoleRefusedError
	switch {
	case err == nil:
		return remote, nil
	case errors.As(err, &refused):
		return nil, refusal(vm, sub, refused)
	default:
		return nil, kerrors.NewServiceUnavailable(fmt.Sprintf("node %s did not open the %s of VirtualMachine %s: %v", node, sub, vm.Name, err))
	}
}

// refusal is a node's refusal as an API error.
func refusal(vm *v1alpha1.VirtualMachine, sub string, r *natswire.ConsoleRefusedError) error {
	switch r.Reason {
	case wire.ConsoleNotFound:
		return kerrors.NewNotFound(vmResource, vm.Name)
	case wire.ConsoleUnavailable:
		return conflict(vm, fmt.Sprintf("has no %s to open: %s", sub, r.Message))
	case wire.ConsoleBusy:
		return kerrors.NewTooManyRequests(fmt.Sprintf("the node of VirtualMachine %s relays as many console sessions as it may: %s", vm.Name, r.Message), 5)
	}
	return kerrors.NewServiceUnavailable(fmt.Sprintf("the node could not open the %s of VirtualMachine %s: %s", sub, vm.Name, r.Message))
}

// relay copies between the client's WebSocket and the node's stream until
// either ends, then ends both.
func relay(conn *websocket.Conn, remote io.ReadWriteCloser) {
	conn.SetReadLimit(maxClientFrame)
	client := wsconsole.New(conn)
	var once sync.Once
	stop := func() {
		once.Do(func() {
			_ = remote.Close()
			_ = client.Close()
		})
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = io.Copy(client, remote)
		stop()
	}()
	_, _ = io.Copy(remote, client)
	stop()
	<-done
}
