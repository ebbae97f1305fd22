package kubevirt

import (
	"context"
	"encoding/json"
	"io"
	"net/http"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/internal/wsconsole"
)

var _ driver.Consoler = (*Driver)(nil)

// streamSubprotocol is the WebSocket subprotocol of virt-api's console and
// VNC streams (kubecli's PlainStreamProtocolName): binary messages carry
// the bytes as they are, both ways.
const streamSubprotocol = "plain.kubevirt.io"

// streams are the VMI subresources of each console kind.
var streams = map[driver.ConsoleKind]string{driver.ConsoleSerial: "console", driver.ConsoleVNC: "vnc"}

// OpenConsole implements driver.Consoler as virtctl console and vnc do: a
// WebSocket to the VMI's console or vnc subresource of KubeVirt's
// subresource API, which the API server proxies to virt-api and virt-api
// to virt-handler on the VMI's node, opened with the agent's own
// credentials (get on virtualmachineinstances/console and /vnc of
// subresources.kubevirt.io). The serial console is the guest's first
// serial port; the display is QEMU's VNC server from its ProtocolVersion
// on. KubeVirt gives a console to the newest session: opening one ends the
// one open before, whoever opened it.
//
// A uid with no VM is NotFound. A guest whose VMI does not run, and a VMI
// or cluster without the console (no virt-api serves the API), are
// Terminal with why; other refusals of virt-api and the API server are
// transient.
func (d *Driver) OpenConsole(ctx context.Context, uid string, kind driver.ConsoleKind) (io.ReadWriteCloser, error) {
	sub, ok := streams[kind]
	if !ok {
		return nil, driver.Terminalf("no console of kind %q: a guest has a %s console and a %s display", kind, driver.ConsoleSerial, driver.ConsoleVNC)
	}
	c, err := d.client()
	if err != nil {
		return nil, err
	}
	_, vmi, err := d.get(ctx, c, uid)
	if err == nil && !runs(vmi) {
		// The refusal is Terminal, so it rests on the API server's word,
		// not on informers that may not have seen the VMI start yet.
		_, vmi, err = d.get(ctx, d.live, uid)
	}
	if err != nil {
		return nil, err
	}
	if !runs(vmi) {
		return nil, driver.Terminalf("guest %s is not running: KubeVirt serves its consoles only while its VMI runs", uid)
	}
	return d.openStream(ctx, vmi, sub)
}

// openStream opens the stream subresource sub of vmi.
func (d *Driver) openStream(ctx context.Context, vmi *kubevirtv1.VirtualMachineInstance, sub string) (io.ReadWriteCloser, error) {
	u := wsconsole.KubeURL(d.subresources.Get().Namespace(vmi.Namespace).Resource("virtualmachineinstances").Name(vmi.Name).SubResource(sub).URL())
	o, err := wsconsole.KubeOptions(d.config, u, streamSubprotocol)
	if err != nil {
		return nil, errors.Wrap(err, "cannot reach the KubeVirt cluster")
	}
	s, err := wsconsole.Dial(ctx, u, o)
	var refused *wsconsole.RefusedError
	switch {
	case errors.As(err, &refused):
		return nil, streamRefused(vmi, sub, refused)
	case err != nil:
		return nil, errors.Wrapf(err, "cannot open the %s of VMI %s/%s", sub, vmi.Namespace, vmi.Name)
	}
	return s, nil
}

// streamRefused is why virt-api or the API server refused the stream sub
// of vmi, from the API status it answered with. virt-api refuses with 400
// or 409 a VMI that does not run or has no such console, and with 404 one
// that is gone: all Terminal. A 404 that names no VMI is the API server's:
// no virt-api serves the subresource API.
func streamRefused(vmi *kubevirtv1.VirtualMachineInstance, sub string, r *wsconsole.RefusedError) error {
	msg := r.Status
	st := &metav1.Status{}
	if json.Unmarshal(r.Body, st) == nil && st.Message != "" {
		msg = st.Message
	}
	fail := func(why string) error {
		return errors.Errorf("cannot open the %s of VMI %s/%s: %s", sub, vmi.Namespace, vmi.Name, why)
	}
	switch r.StatusCode {
	case http.StatusNotFound:
		if st.Details != nil && st.Details.Kind == "virtualmachineinstance" {
			return driver.Terminal(fail("the guest is not running: " + msg))
		}
		return driver.Terminal(fail("the cluster serves no " + kubevirtv1.SubresourceGroupName + "/" + kubevirtv1.ApiLatestVersion + " API (KubeVirt's virt-api serves it)"))
	case http.StatusBadRequest, http.StatusConflict:
		return driver.Terminal(fail(msg))
	}
	return fail(msg)
}
