package kubevirt

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"testing"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/rest"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/internal/harness/guestconsole"
	"github.com/virtfleet/virtfleet/internal/wsconsole"
)

// openConsole opens console kind of uid for t, closed at t's end.
func (e *env) openConsole(t *testing.T, uid string, kind driver.ConsoleKind) io.ReadWriteCloser {
	t.Helper()
	s, err := e.d.OpenConsole(context.Background(), uid, kind)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// TestConsoles opens a running guest's serial console and display through
// KubeVirt's subresource API, which the test cluster serves as virt-api
// does, with a guest's answers behind it.
func TestConsoles(t *testing.T) {
	e := newEnv(t)
	m := e.machine()
	e.ensureUntil(m, phaseIs(driver.PhaseRunning))
	prompt := guestconsole.LoginPrompt(VMName(m.UID))

	t.Run("TheSerialConsoleCarriesBytesBothWays", func(t *testing.T) {
		s := e.openConsole(t, m.UID, driver.ConsoleSerial)
		guestconsole.ReadUntil(t, s, prompt)
		_, err := s.Write([]byte("root\r"))
		require.NoError(t, err)
		guestconsole.ReadUntil(t, s, prompt)
		require.NoError(t, s.Close())
	})

	t.Run("TheDisplayIsAnRFBServer", func(t *testing.T) {
		s := e.openConsole(t, m.UID, driver.ConsoleVNC)
		guestconsole.ReadUntil(t, s, "RFB 003.008\n")
	})

	t.Run("APausedGuestKeepsItsConsoles", func(t *testing.T) {
		paused := m
		paused.Paused = true
		e.ensureUntil(paused, phaseIs(driver.PhasePaused))
		guestconsole.ReadUntil(t, e.openConsole(t, m.UID, driver.ConsoleSerial), prompt)
	})
}

// TestConsoleRefusals pins what a console that cannot be had returns.
func TestConsoleRefusals(t *testing.T) {
	e := newEnv(t)
	running := e.machine()
	e.ensureUntil(running, phaseIs(driver.PhaseRunning))
	stopped := e.machine()
	stopped.Running = false
	e.ensureUntil(stopped, phaseIs(driver.PhaseStopped))
	gone := &kubevirtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: "gone"}}

	cases := []struct {
		name     string
		open     func(d *Driver) error
		notFound bool
		message  string
	}{
		{name: "AnUnknownGuestIsNotOnTheNode", notFound: true, message: "no KubeVirt VirtualMachine of uid", open: func(d *Driver) error {
			_, err := d.OpenConsole(context.Background(), string(uuid.NewUUID()), driver.ConsoleSerial)
			return err
		}},
		{name: "AStoppedGuestHasNoConsole", message: "is not running: KubeVirt serves its consoles only while its VMI runs", open: func(d *Driver) error {
			_, err := d.OpenConsole(context.Background(), stopped.UID, driver.ConsoleVNC)
			return err
		}},
		{name: "AnUnknownKindIsNoConsole", message: `no console of kind "spice"`, open: func(d *Driver) error {
			_, err := d.OpenConsole(context.Background(), running.UID, "spice")
			return err
		}},
		{name: "AVMIGoneSinceTheInformersSawItIsNotRunning", message: `the guest is not running: virtualmachineinstance.kubevirt.io "gone" not found`, open: func(d *Driver) error {
			_, err := d.openStream(context.Background(), gone, "console")
			return err
		}},
		{name: "AClusterWithoutVirtAPIHasNoConsoles", message: "the cluster serves no subresources.kubevirt.io/v1 API (KubeVirt's virt-api serves it)", open: func(d *Driver) error {
			sub := rest.CopyConfig(cluster.Config)
			sub.GroupVersion = &schema.GroupVersion{Group: "nothing." + kubevirtv1.SubresourceGroupName, Version: kubevirtv1.ApiLatestVersion}
			sub.APIPath = "/apis"
			sub.NegotiatedSerializer = serializer.NewCodecFactory(cluster.Scheme).WithoutConversion()
			rc, err := rest.RESTClientFor(sub)
			require.NoError(t, err)
			d.subresources = rc
			_, err = d.openStream(context.Background(), gone, "console")
			return err
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.open(e.open())
			require.Error(t, err)
			assert.Equal(t, tc.notFound, driver.IsNotFound(err), "NotFound: %v", err)
			assert.Equal(t, !tc.notFound, driver.IsTerminal(err), "Terminal: %v", err)
			assert.Contains(t, err.Error(), tc.message)
		})
	}
}

// TestStreamRefusedReadsTheAPIStatus pins how each refusal of virt-api or
// the API server is classified.
func TestStreamRefusedReadsTheAPIStatus(t *testing.T) {
	vmi := &kubevirtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "vm"}}
	refusal := func(err *kerrors.StatusError) *wsconsole.RefusedError {
		st := err.Status()
		body, jerr := json.Marshal(&st)
		require.NoError(t, jerr)
		return &wsconsole.RefusedError{StatusCode: int(st.Code), Status: http.StatusText(int(st.Code)), Body: body}
	}
	vmiResource := kubevirtv1.Resource("virtualmachineinstance")
	cases := []struct {
		name     string
		refused  *wsconsole.RefusedError
		terminal bool
		message  string
	}{
		{name: "NotRunning", refused: refusal(kerrors.NewBadRequest("VMI is not running")), terminal: true,
			message: "cannot open the console of VMI ns/vm: VMI is not running"},
		{name: "Failed", refused: refusal(kerrors.NewConflict(vmiResource, "vm", errors.New("VMI is in failed status"))), terminal: true,
			message: `cannot open the console of VMI ns/vm: Operation cannot be fulfilled on virtualmachineinstance.kubevirt.io "vm": VMI is in failed status`},
		{name: "VMIGone", refused: refusal(kerrors.NewNotFound(vmiResource, "vm")), terminal: true,
			message: `cannot open the console of VMI ns/vm: the guest is not running: virtualmachineinstance.kubevirt.io "vm" not found`},
		{name: "NoSuchAPI", refused: &wsconsole.RefusedError{StatusCode: http.StatusNotFound, Status: "404 Not Found", Body: []byte("404 page not found")}, terminal: true,
			message: "cannot open the console of VMI ns/vm: the cluster serves no subresources.kubevirt.io/v1 API (KubeVirt's virt-api serves it)"},
		{name: "VirtAPIUnavailableIsTransient", refused: refusal(kerrors.NewServiceUnavailable("virt-api is restarting")),
			message: "cannot open the console of VMI ns/vm: virt-api is restarting"},
		{name: "ForbiddenIsTransient", refused: refusal(kerrors.NewForbidden(schema.GroupResource{Group: kubevirtv1.SubresourceGroupName, Resource: "virtualmachineinstances/console"}, "vm", errors.New("RBAC"))),
			message: `"vm" is forbidden: RBAC`},
		{name: "ABodyThatIsNoStatusGivesTheHTTPStatus", refused: &wsconsole.RefusedError{StatusCode: http.StatusBadGateway, Status: "502 Bad Gateway", Body: []byte("<html>")},
			message: "cannot open the console of VMI ns/vm: 502 Bad Gateway"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := streamRefused(vmi, "console", tc.refused)
			assert.Equal(t, tc.terminal, driver.IsTerminal(err), "Terminal: %v", err)
			assert.False(t, driver.IsNotFound(err), "the VM is there: %v", err)
			assert.Contains(t, err.Error(), tc.message)
		})
	}
}
