package subresources

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/event"
	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
	"github.com/go-logr/logr"
	"github.com/gorilla/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	v1alpha1 "github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/bus"
	"github.com/virtfleet/virtfleet/hub/internal/fleet"
	"github.com/virtfleet/virtfleet/internal/harness/controlplane"
	"github.com/virtfleet/virtfleet/internal/harness/natstest"
	"github.com/virtfleet/virtfleet/internal/natswire"
)

// TestOneNamespaceCannotTakeEveryConsole is an attack by a tenant with
// the console verb in its own namespace, against a real kube-apiserver and
// a real nats-server whose node serves every console it is asked for:
//
//  1. mallory creates VMs in namespace tenant-a and opens their consoles,
//     one after another, holding each open;
//  2. once tenant-a holds its share she opens one more;
//  3. alice, in tenant-b, opens the console of her VM.
//
// Before the share, mallory's sessions took every slot of the hub and
// alice's console was refused until mallory let go. Now mallory's extra
// session is refused with 429 naming the limit, and alice's opens.
func TestOneNamespaceCannotTakeEveryConsole(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a kube-apiserver; skipped with -short")
	}
	ctrl.SetLogger(logr.Discard())
	const (
		node         = "node1"
		slots        = 4
		perNamespace = 2
	)
	ctx := context.Background()
	cp := controlplane.StartForTest(t)

	hub, agents, users := natstest.Identities(t, node)
	srv := natstest.New(t, users...)
	hubConn, _ := natstest.Connect(t, srv, hub)
	b, err := bus.New(ctx, hubConn, bus.Config{})
	require.NoError(t, err)
	f := fleet.New(b, logging.NewNopLogger()).WithSealKey([]byte("test seal key"))
	agentConn, _ := natstest.Connect(t, srv, agents[node])
	serveCtx, stop := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() {
		served <- natswire.ServeConsoles(serveCtx, agentConn, node, natswire.ConsoleLimits{}, logging.NewNopLogger(), func(context.Context, wire.ConsoleOpen) (io.ReadWriteCloser, error) {
			agentEnd, guestEnd := net.Pipe()
			t.Cleanup(func() { _ = guestEnd.Close() })
			return agentEnd, nil
		})
	}()
	t.Cleanup(func() { stop(); require.NoError(t, <-served) })
	require.Eventually(t, func() bool { return agentConn.NumSubscriptions() > 0 }, 10*time.Second, 5*time.Millisecond)
	require.NoError(t, agentConn.Flush())

	s := New(Options{Sessions: slots, SessionsPerNamespace: perNamespace}, cp.Client, cp.Client,
		func(context.Context, *v1alpha1.VirtualMachine) (*fleet.Fleet, error) { return f, nil },
		logging.NewNopLogger(), event.NewNopRecorder())
	// The front proxy's certificate is TestFrontProxy's; here every
	// request is the tenant's own, as the API server passed it on.
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+prefix+"/namespaces/{namespace}/virtualmachines/{name}/console", func(w http.ResponseWriter, r *http.Request) {
		s.stream(w, r, user{Name: "tenant"})
	})
	api := httptest.NewServer(mux)
	t.Cleanup(api.Close)

	placedVM := func(namespace, name string) {
		t.Helper()
		vm := &v1alpha1.VirtualMachine{
			ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
			Spec: v1alpha1.VirtualMachineSpec{ForProvider: v1alpha1.VirtualMachineParameters{
				Vcpu: 1, Memory: resource.MustParse("128Mi"), DiskAttachments: []v1alpha1.DiskAttachment{{Name: "root"}},
			}},
		}
		require.NoError(t, cp.Client.Create(ctx, vm))
		vm.Annotations = map[string]string{v1alpha1.AnnotationNode: node, v1alpha1.AnnotationSeal: f.Seal(string(vm.UID), node, "")}
		require.NoError(t, cp.Client.Update(ctx, vm))
		vm.Status.AtProvider.Phase = v1alpha1.PhaseRunning
		require.NoError(t, cp.Client.Status().Update(ctx, vm))
	}
	open := func(namespace, name string) (*websocket.Conn, int, string) {
		t.Helper()
		url := fmt.Sprintf("ws%s%s/namespaces/%s/virtualmachines/%s/console", strings.TrimPrefix(api.URL, "http"), prefix, namespace, name)
		d := websocket.Dialer{Subprotocols: []string{Subprotocol}, HandshakeTimeout: 30 * time.Second}
		conn, resp, err := d.Dial(url, nil)
		if err == nil {
			t.Cleanup(func() { _ = conn.Close() })
			return conn, http.StatusSwitchingProtocols, ""
		}
		require.NotNil(t, resp, err)
		defer resp.Body.Close() //nolint:errcheck // read to its end below
		var st metav1.Status
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&st))
		return nil, resp.StatusCode, st.Message
	}

	for _, ns := range []string{"tenant-a", "tenant-b"} {
		require.NoError(t, cp.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}))
	}
	for i := range slots {
		placedVM("tenant-a", fmt.Sprintf("mallory-%d", i))
	}
	placedVM("tenant-b", "alice")

	for i := range perNamespace {
		_, code, msg := open("tenant-a", fmt.Sprintf("mallory-%d", i))
		require.Equal(t, http.StatusSwitchingProtocols, code, "tenant-a's share opens: %s", msg)
	}
	for i := perNamespace; i < slots; i++ {
		_, code, msg := open("tenant-a", fmt.Sprintf("mallory-%d", i))
		assert.Equal(t, http.StatusTooManyRequests, code, "beyond its share")
		assert.Contains(t, msg, "namespace tenant-a holds 2 console sessions on this hub, the most one namespace may")
	}
	_, code, msg := open("tenant-b", "alice")
	assert.Equal(t, http.StatusSwitchingProtocols, code, "another namespace's console opens beside the attacker's: %s", msg)
}

func TestSessionSlotsComeBack(t *testing.T) {
	s := newSessionSlots(2, 1)
	release, err := s.take("a")
	require.NoError(t, err)
	_, err = s.take("a")
	require.Error(t, err, "a's share is taken")
	other, err := s.take("b")
	require.NoError(t, err)
	_, err = s.take("c")
	require.ErrorContains(t, err, "this hub relays 2 console sessions already")
	release()
	release()
	_, err = s.take("a")
	require.NoError(t, err, "a released its one session, once however often it says so")
	_, err = s.take("c")
	require.Error(t, err, "a second release gave back no slot it did not hold")
	other()
}
