package kubevirttest

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"time"

	"github.com/gorilla/websocket"
	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/internal/harness/guestconsole"
)

// VirtAPINamespace holds the Service the subresource API is registered
// with, as virt-operator puts virt-api in the kubevirt namespace.
const VirtAPINamespace = "kubevirt"

// The messages virt-api refuses a pause or unpause with
// (pkg/virt-api/rest/subresource.go), and a console or VNC connection.
const (
	msgNotRunning    = "VMI is not running"
	msgAlreadyPaused = "VMI is already paused"
	msgNotPaused     = "VMI is not paused"
	msgFailed        = "VMI is in failed status"
	msgNoSerial      = "No serial consoles are present."
	msgNoGraphics    = "No graphics devices are present."
)

// StreamSubprotocol is the WebSocket subprotocol of virt-api's console and
// VNC streams (kubecli's PlainStreamProtocolName): binary messages carry
// the bytes as they are, both ways.
const StreamSubprotocol = "plain.kubevirt.io"

// The reason and message virt-handler gives the Paused condition of a VMI
// the user paused.
const (
	ReasonPausedByUser = "PausedByUser"
	msgPausedByUser    = "VMI was paused by user"
)

// availableTimeout bounds the wait for the API server to find the
// subresource API available.
const availableTimeout = 30 * time.Second

// virtAPI plays the part of virt-api that serves KubeVirt's subresource
// API, subresources.kubevirt.io/v1, and the part of virt-handler that
// carries out what it asks: it pauses and unpauses VMIs. As KubeVirt does,
// it is an aggregated API server: the API server proxies
// /apis/subresources.kubevirt.io/v1/... to it through an APIService, so
// clients reach it at the API server's address with their usual
// credentials. It serves discovery, the PUT of
// virtualmachineinstances/{name}/pause and /unpause and of
// virtualmachines/{name}/addvolume and /removevolume (see addVolume), and
// the GET of
// /console and /vnc, WebSockets of the guest's serial console and
// display, with virt-api's checks and errors; it does not check who asks
// (the API server has authorized the request against the subresource's
// RBAC already).
//
// Behind a console or VNC stream there is no guest but what one would
// say: the serial console prompts for a login (guestconsole.LoginPrompt) when the
// session opens and after each carriage return or line feed it receives,
// and the display sends its ProtocolVersion (guestconsole.RFBVersion) and reads on.
type virtAPI struct {
	client client.Client
	server *httptest.Server

	mu sync.Mutex
	// streams are the console and VNC sessions open; closed, when the
	// server is, so none outlives it.
	streams map[*websocket.Conn]struct{}
	closed  bool
}

// startVirtAPI starts the subresource API on a port of the loopback and
// registers it with the API server c reaches: a Service of type
// ExternalName naming localhost, which the API server's aggregator
// resolves without cluster networking, and the APIService, whose
// availability it waits for.
func startVirtAPI(ctx context.Context, c client.Client) (*virtAPI, error) {
	v := &virtAPI{client: c, streams: map[*websocket.Conn]struct{}{}}
	mux := http.NewServeMux()
	gv := kubevirtv1.SubresourceGroupName + "/" + kubevirtv1.ApiLatestVersion
	mux.HandleFunc("GET /apis", v.groups)
	mux.HandleFunc("GET /apis/"+kubevirtv1.SubresourceGroupName, v.group)
	mux.HandleFunc("GET /apis/"+gv, v.resources)
	vmi := "/apis/" + gv + "/namespaces/{namespace}/virtualmachineinstances/{name}/"
	mux.HandleFunc("PUT "+vmi+"pause", v.pause)
	mux.HandleFunc("PUT "+vmi+"unpause", v.unpause)
	mux.HandleFunc("GET "+vmi+"console", v.console)
	mux.HandleFunc("GET "+vmi+"vnc", v.vnc)
	vm := "/apis/" + gv + "/namespaces/{namespace}/virtualmachines/{name}/"
	mux.HandleFunc("PUT "+vm+"addvolume", v.addVolume)
	mux.HandleFunc("PUT "+vm+"removevolume", v.removeVolume)
	mux.HandleFunc("POST "+vmValidatePath, v.validateVM)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, errors.Wrap(err, "cannot listen for the subresource API")
	}
	v.server = httptest.NewUnstartedServer(mux)
	_ = v.server.Listener.Close()
	v.server.Listener = l
	v.server.StartTLS()
	if err := v.register(ctx, l.Addr().(*net.TCPAddr).Port); err != nil { //nolint:forcetypeassert // a TCP listener
		v.server.Close()
		return nil, err
	}
	if err := v.registerWebhook(ctx); err != nil {
		v.server.Close()
		return nil, err
	}
	return v, nil
}

// close stops the server and ends the streams open on it, which a
// server's Close leaves alone once they are upgraded.
func (v *virtAPI) close() {
	v.mu.Lock()
	v.closed = true
	for conn := range v.streams {
		_ = conn.Close()
	}
	v.mu.Unlock()
	v.server.Close()
}

// register makes the API server proxy the subresource API to port.
func (v *virtAPI) register(ctx context.Context, port int) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: VirtAPINamespace}}
	if err := v.client.Create(ctx, ns); err != nil && !kerrors.IsAlreadyExists(err) {
		return errors.Wrap(err, "cannot create the namespace of the subresource API")
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: VirtAPINamespace, Name: "virt-api"},
		Spec: corev1.ServiceSpec{
			Type:         corev1.ServiceTypeExternalName,
			ExternalName: "localhost",
			Ports:        []corev1.ServicePort{{Name: "https", Port: int32(port)}}, //nolint:gosec // a port
		},
	}
	if err := v.client.Create(ctx, svc); err != nil {
		return errors.Wrap(err, "cannot create the Service of the subresource API")
	}
	apiService := &apiregistrationv1.APIService{
		ObjectMeta: metav1.ObjectMeta{Name: kubevirtv1.ApiLatestVersion + "." + kubevirtv1.SubresourceGroupName},
		Spec: apiregistrationv1.APIServiceSpec{
			Service: &apiregistrationv1.ServiceReference{Namespace: svc.Namespace, Name: svc.Name, Port: ptr(int32(port))}, //nolint:gosec // a port
			Group:   kubevirtv1.SubresourceGroupName,
			Version: kubevirtv1.ApiLatestVersion,
			// The test server's certificate is made up at each start; the
			// API server is on the same host.
			InsecureSkipTLSVerify: true,
			GroupPriorityMinimum:  1000,
			VersionPriority:       15,
		},
	}
	if err := v.client.Create(ctx, apiService); err != nil {
		return errors.Wrap(err, "cannot create the APIService of the subresource API")
	}
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, availableTimeout, true, func(ctx context.Context) (bool, error) {
		if err := v.client.Get(ctx, client.ObjectKeyFromObject(apiService), apiService); err != nil {
			return false, nil //nolint:nilerr // the API server may not serve it yet
		}
		for _, c := range apiService.Status.Conditions {
			if c.Type == apiregistrationv1.Available {
				return c.Status == apiregistrationv1.ConditionTrue, nil
			}
		}
		return false, nil
	})
	return errors.Wrapf(err, "the API server did not find the subresource API at port %d available within %s", port, availableTimeout)
}

func (v *virtAPI) groups(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, &metav1.APIGroupList{TypeMeta: metav1.TypeMeta{Kind: "APIGroupList", APIVersion: "v1"}, Groups: []metav1.APIGroup{subresourceGroup()}})
}

func (v *virtAPI) group(w http.ResponseWriter, _ *http.Request) {
	g := subresourceGroup()
	g.TypeMeta = metav1.TypeMeta{Kind: "APIGroup", APIVersion: "v1"}
	writeJSON(w, http.StatusOK, &g)
}

func subresourceGroup() metav1.APIGroup {
	gv := metav1.GroupVersionForDiscovery{GroupVersion: kubevirtv1.SubresourceGroupName + "/" + kubevirtv1.ApiLatestVersion, Version: kubevirtv1.ApiLatestVersion}
	return metav1.APIGroup{Name: kubevirtv1.SubresourceGroupName, Versions: []metav1.GroupVersionForDiscovery{gv}, PreferredVersion: gv}
}

// resources lists the subresources served, as virt-api lists them (with
// many more).
func (v *virtAPI) resources(w http.ResponseWriter, _ *http.Request) {
	list := &metav1.APIResourceList{
		TypeMeta:     metav1.TypeMeta{Kind: "APIResourceList", APIVersion: "v1"},
		GroupVersion: kubevirtv1.SubresourceGroupName + "/" + kubevirtv1.ApiLatestVersion,
	}
	for _, sub := range []string{"pause", "unpause"} {
		list.APIResources = append(list.APIResources, metav1.APIResource{Name: "virtualmachineinstances/" + sub, Namespaced: true, Kind: "VirtualMachineInstance", Verbs: metav1.Verbs{"update"}})
	}
	for _, sub := range []string{"addvolume", "removevolume"} {
		list.APIResources = append(list.APIResources, metav1.APIResource{Name: "virtualmachines/" + sub, Namespaced: true, Kind: "VirtualMachine", Verbs: metav1.Verbs{"update"}})
	}
	for _, sub := range []string{"console", "vnc"} {
		list.APIResources = append(list.APIResources, metav1.APIResource{Name: "virtualmachineinstances/" + sub, Namespaced: true, Kind: "VirtualMachineInstance", Verbs: metav1.Verbs{"get"}})
	}
	writeJSON(w, http.StatusOK, list)
}

// upgrader upgrades a stream as virt-api does (kubecli.NewUpgrader): the
// origin is the API server's proxy, not a browser's.
var upgrader = websocket.Upgrader{
	Subprotocols: []string{StreamSubprotocol},
	CheckOrigin:  func(*http.Request) bool { return true },
}

// console serves the VMI's serial console to a client, once virt-api's
// checks pass: the VMI exists, has a serial console, has not failed, and
// runs (a paused VMI runs).
func (v *virtAPI) console(w http.ResponseWriter, r *http.Request) {
	v.stream(w, r, func(vmi *kubevirtv1.VirtualMachineInstance) *kerrors.StatusError {
		switch {
		case vmi.Spec.Domain.Devices.AutoattachSerialConsole != nil && !*vmi.Spec.Domain.Devices.AutoattachSerialConsole:
			return kerrors.NewBadRequest(msgNoSerial)
		case vmi.Status.Phase == kubevirtv1.Failed:
			return conflictError(vmi.Name, msgFailed)
		case vmi.Status.Phase != kubevirtv1.Running:
			return kerrors.NewBadRequest(msgNotRunning)
		}
		return nil
	}, func(conn *websocket.Conn, vmi *kubevirtv1.VirtualMachineInstance) {
		guestconsole.Serial(conn, vmi.Name)
	})
}

// vnc serves the VMI's display to a client, once virt-api's checks pass:
// the VMI exists, has a display and runs.
func (v *virtAPI) vnc(w http.ResponseWriter, r *http.Request) {
	v.stream(w, r, func(vmi *kubevirtv1.VirtualMachineInstance) *kerrors.StatusError {
		switch {
		case vmi.Spec.Domain.Devices.AutoattachGraphicsDevice != nil && !*vmi.Spec.Domain.Devices.AutoattachGraphicsDevice:
			return kerrors.NewBadRequest(msgNoGraphics)
		case vmi.Status.Phase != kubevirtv1.Running:
			return kerrors.NewBadRequest(msgNotRunning)
		}
		return nil
	}, func(conn *websocket.Conn, _ *kubevirtv1.VirtualMachineInstance) {
		guestconsole.Display(conn)
	})
}

// stream reads the VMI and checks it with validate, answering a refusal as
// virt-api does (an API status, before any upgrade), then upgrades the
// request and runs guest on the WebSocket until either side ends it.
func (v *virtAPI) stream(w http.ResponseWriter, r *http.Request, validate func(*kubevirtv1.VirtualMachineInstance) *kerrors.StatusError, guest func(*websocket.Conn, *kubevirtv1.VirtualMachineInstance)) {
	nn := types.NamespacedName{Namespace: r.PathValue("namespace"), Name: r.PathValue("name")}
	vmi := &kubevirtv1.VirtualMachineInstance{}
	switch err := v.client.Get(r.Context(), nn, vmi); {
	case kerrors.IsNotFound(err):
		writeStatus(w, kerrors.NewNotFound(vmiResource, nn.Name))
		return
	case err != nil:
		writeStatus(w, kerrors.NewInternalError(err))
		return
	}
	if refused := validate(vmi); refused != nil {
		writeStatus(w, refused)
		return
	}
	conn, err := upgrader.Upgrade(w, r, nil)
	if err != nil {
		return // the upgrader answered
	}
	defer conn.Close() //nolint:errcheck // the session is over
	v.mu.Lock()
	if v.closed {
		v.mu.Unlock()
		return
	}
	v.streams[conn] = struct{}{}
	v.mu.Unlock()
	defer func() {
		v.mu.Lock()
		delete(v.streams, conn)
		v.mu.Unlock()
	}()
	guest(conn, vmi)
}

// pause pauses a running VMI that is not paused: virt-handler pauses the
// domain and gives the VMI the condition Paused.
func (v *virtAPI) pause(w http.ResponseWriter, r *http.Request) {
	v.act(w, r, &kubevirtv1.PauseOptions{}, func(vmi *kubevirtv1.VirtualMachineInstance) *kerrors.StatusError {
		switch {
		case vmi.Status.Phase != kubevirtv1.Running:
			return conflictError(vmi.Name, msgNotRunning)
		case vmi.Spec.LivenessProbe != nil:
			return kerrors.NewForbidden(vmiResource, vmi.Name, errors.New("Pausing VMIs with LivenessProbe is currently not supported")) //nolint:staticcheck // virt-api's own message
		case IsPaused(vmi):
			return conflictError(vmi.Name, msgAlreadyPaused)
		}
		now := metav1.Now()
		vmi.Status.Conditions = append(vmi.Status.Conditions, kubevirtv1.VirtualMachineInstanceCondition{
			Type: kubevirtv1.VirtualMachineInstancePaused, Status: corev1.ConditionTrue,
			LastProbeTime: now, LastTransitionTime: now, Reason: ReasonPausedByUser, Message: msgPausedByUser,
		})
		return nil
	})
}

// unpause resumes a paused VMI: virt-handler resumes the domain and drops
// the condition.
func (v *virtAPI) unpause(w http.ResponseWriter, r *http.Request) {
	v.act(w, r, &kubevirtv1.UnpauseOptions{}, func(vmi *kubevirtv1.VirtualMachineInstance) *kerrors.StatusError {
		switch {
		case vmi.Status.Phase != kubevirtv1.Running:
			return conflictError(vmi.Name, msgNotRunning)
		case !IsPaused(vmi):
			return conflictError(vmi.Name, msgNotPaused)
		}
		conds := vmi.Status.Conditions[:0]
		for _, c := range vmi.Status.Conditions {
			if c.Type != kubevirtv1.VirtualMachineInstancePaused {
				conds = append(conds, c)
			}
		}
		vmi.Status.Conditions = conds
		return nil
	})
}

var vmiResource = kubevirtv1.Resource("virtualmachineinstance")

func conflictError(name, msg string) *kerrors.StatusError {
	return kerrors.NewConflict(vmiResource, name, errors.New(msg))
}

// act reads the request's options into opts, then the VMI, checks and
// changes it with change, and writes it back; a dry run changes nothing.
func (v *virtAPI) act(w http.ResponseWriter, r *http.Request, opts any, change func(*kubevirtv1.VirtualMachineInstance) *kerrors.StatusError) {
	dryRun := false
	if r.ContentLength != 0 {
		if err := json.NewDecoder(r.Body).Decode(opts); err != nil {
			writeStatus(w, kerrors.NewBadRequest(fmt.Sprintf("Can not unmarshal Request body to struct, error: %v", err)))
			return
		}
		switch o := opts.(type) {
		case *kubevirtv1.PauseOptions:
			dryRun = len(o.DryRun) > 0
		case *kubevirtv1.UnpauseOptions:
			dryRun = len(o.DryRun) > 0
		}
	}
	nn := types.NamespacedName{Namespace: r.PathValue("namespace"), Name: r.PathValue("name")}
	var refused *kerrors.StatusError
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		vmi := &kubevirtv1.VirtualMachineInstance{}
		if err := v.client.Get(r.Context(), nn, vmi); err != nil {
			return err
		}
		if refused = change(vmi); refused != nil || dryRun {
			return nil
		}
		// KubeVirt serves VMIs without a status subresource.
		return v.client.Update(r.Context(), vmi)
	})
	var status kerrors.APIStatus
	switch {
	case refused != nil:
		writeStatus(w, refused)
	case kerrors.IsNotFound(err):
		writeStatus(w, kerrors.NewNotFound(vmiResource, nn.Name))
	case errors.As(err, &status):
		writeStatus(w, status)
	case err != nil:
		writeStatus(w, kerrors.NewInternalError(err))
	default:
		w.WriteHeader(http.StatusOK)
	}
}

// IsPaused reports whether a VMI has the condition Paused that
// virt-handler gives a VMI the user paused.
func IsPaused(vmi *kubevirtv1.VirtualMachineInstance) bool {
	for _, c := range vmi.Status.Conditions {
		if c.Type == kubevirtv1.VirtualMachineInstancePaused {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func writeStatus(w http.ResponseWriter, s kerrors.APIStatus) {
	st := s.Status()
	st.TypeMeta = metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}
	writeJSON(w, int(st.Code), &st)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(code)
	_, _ = w.Write(b)
}
