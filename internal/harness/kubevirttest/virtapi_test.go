package kubevirttest

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"testing"

	"github.com/gorilla/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/virtfleet/virtfleet/internal/harness/guestconsole"
)

// bareVMI creates a VMI of no VM in phase, changed by opts: the fake
// virt-controller leaves it as it is.
func bareVMI(t *testing.T, c *Cluster, name string, phase kubevirtv1.VirtualMachineInstancePhase, opts ...func(*kubevirtv1.VirtualMachineInstance)) {
	t.Helper()
	vmi := &kubevirtv1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Namespace: DefaultNamespace, Name: name},
		Spec:       kubevirtv1.VirtualMachineInstanceSpec{Domain: kubevirtv1.DomainSpec{Devices: kubevirtv1.Devices{}}},
		// No status subresource: the status is kept as created.
		Status: kubevirtv1.VirtualMachineInstanceStatus{Phase: phase},
	}
	for _, o := range opts {
		o(vmi)
	}
	require.NoError(t, c.Client.Create(context.Background(), vmi))
}

// dialStream opens stream sub (console, vnc) of VMI name as virtctl does:
// a WebSocket to the API server, which proxies it to virt-api.
func dialStream(t *testing.T, c *Cluster, name, sub string) (*websocket.Conn, *http.Response, error) {
	t.Helper()
	u, err := url.Parse(c.Config.Host)
	require.NoError(t, err)
	u.Scheme = "wss"
	u.Path = "/apis/" + kubevirtv1.SubresourceGroupName + "/" + kubevirtv1.ApiLatestVersion + "/namespaces/" + DefaultNamespace + "/virtualmachineinstances/" + name + "/" + sub
	tlsConfig, err := rest.TLSConfigFor(c.Config)
	require.NoError(t, err)
	d := websocket.Dialer{TLSClientConfig: tlsConfig, Subprotocols: []string{StreamSubprotocol}}
	conn, resp, err := d.DialContext(context.Background(), u.String(), nil)
	if conn != nil {
		t.Cleanup(func() { _ = conn.Close() })
	}
	return conn, resp, err
}

// TestVirtAPIServesConsoles opens VMIs' serial consoles and displays
// through the API server as virtctl console and vnc do, and pins virt-api's
// refusals.
func TestVirtAPIServesConsoles(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a control plane; skipped with -short")
	}
	c := StartForTest(t, Options{})
	bareVMI(t, c, "running", kubevirtv1.Running)

	t.Run("DiscoveryListsTheStreams", func(t *testing.T) {
		rc, err := rest.RESTClientFor(subresourceConfig(c))
		require.NoError(t, err)
		body, err := rc.Get().AbsPath("/apis", kubevirtv1.SubresourceGroupName, kubevirtv1.ApiLatestVersion).DoRaw(context.Background())
		require.NoError(t, err)
		list := &metav1.APIResourceList{}
		require.NoError(t, json.Unmarshal(body, list))
		verbs := map[string]metav1.Verbs{}
		for _, r := range list.APIResources {
			verbs[r.Name] = r.Verbs
		}
		assert.Equal(t, metav1.Verbs{"get"}, verbs["virtualmachineinstances/console"])
		assert.Equal(t, metav1.Verbs{"get"}, verbs["virtualmachineinstances/vnc"])
	})

	t.Run("TheSerialConsolePromptsAgainOnEachLine", func(t *testing.T) {
		conn, _, err := dialStream(t, c, "running", "console")
		require.NoError(t, err)
		assert.Equal(t, StreamSubprotocol, conn.Subprotocol())
		prompt := guestconsole.LoginPrompt("running")
		assert.Equal(t, "\r\nrunning login: ", prompt)
		guestconsole.ReadMessagesUntil(t, conn, prompt)
		require.NoError(t, conn.WriteMessage(websocket.BinaryMessage, []byte("root\r")))
		guestconsole.ReadMessagesUntil(t, conn, prompt)
		require.NoError(t, conn.WriteMessage(websocket.BinaryMessage, []byte("a\nb\r")))
		guestconsole.ReadMessagesUntil(t, conn, prompt+prompt)
	})

	t.Run("TheDisplaySendsItsProtocolVersion", func(t *testing.T) {
		conn, _, err := dialStream(t, c, "running", "vnc")
		require.NoError(t, err)
		assert.Equal(t, StreamSubprotocol, conn.Subprotocol())
		guestconsole.ReadMessagesUntil(t, conn, "RFB 003.008\n")
	})

	no := false
	bareVMI(t, c, "scheduling", kubevirtv1.Scheduling)
	bareVMI(t, c, "failed", kubevirtv1.Failed)
	bareVMI(t, c, "headless", kubevirtv1.Running, func(v *kubevirtv1.VirtualMachineInstance) {
		v.Spec.Domain.Devices.AutoattachSerialConsole = &no
		v.Spec.Domain.Devices.AutoattachGraphicsDevice = &no
	})
	cases := []struct {
		name, vmi, sub string
		code           int
		message        string
	}{
		{name: "ConsoleOfNoVMI", vmi: "nothing", sub: "console", code: http.StatusNotFound, message: `virtualmachineinstance.kubevirt.io "nothing" not found`},
		{name: "ConsoleOfAVMIThatDoesNotRunYet", vmi: "scheduling", sub: "console", code: http.StatusBadRequest, message: "VMI is not running"},
		{name: "ConsoleOfAFailedVMI", vmi: "failed", sub: "console", code: http.StatusConflict, message: `Operation cannot be fulfilled on virtualmachineinstance.kubevirt.io "failed": VMI is in failed status`},
		{name: "ConsoleOfAVMIWithoutOne", vmi: "headless", sub: "console", code: http.StatusBadRequest, message: "No serial consoles are present."},
		{name: "DisplayOfNoVMI", vmi: "nothing", sub: "vnc", code: http.StatusNotFound, message: `virtualmachineinstance.kubevirt.io "nothing" not found`},
		{name: "DisplayOfAVMIThatDoesNotRunYet", vmi: "scheduling", sub: "vnc", code: http.StatusBadRequest, message: "VMI is not running"},
		{name: "DisplayOfAFailedVMI", vmi: "failed", sub: "vnc", code: http.StatusBadRequest, message: "VMI is not running"},
		{name: "DisplayOfAVMIWithoutOne", vmi: "headless", sub: "vnc", code: http.StatusBadRequest, message: "No graphics devices are present."},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, resp, err := dialStream(t, c, tc.vmi, tc.sub)
			require.ErrorIs(t, err, websocket.ErrBadHandshake)
			require.NotNil(t, resp)
			assert.Equal(t, tc.code, resp.StatusCode)
			body, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			st := &metav1.Status{}
			require.NoError(t, json.Unmarshal(body, st), "an API status: %s", body)
			assert.Equal(t, tc.message, st.Message)
		})
	}
}
