package subresources

import (
	"encoding/json"
	"net/http"

	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	v1alpha1 "github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
)

// The subresources of a VirtualMachine, each with the HTTP method (and so
// the RBAC verb: GET is get, PUT is update) that reaches it.
var (
	// streams are opened with a GET upgraded to a WebSocket (streamKinds
	// says which console each is).
	streams = []string{"console", "vnc"}
	// actions are a PUT each.
	actions = []string{"start", "stop", "restart", "reset", "pause", "unpause", "migrate"}
)

// vmResource is what errors name.
var vmResource = schema.GroupResource{Group: v1alpha1.Group, Resource: "virtualmachines"}

const prefix = "/apis/" + Group + "/" + Version

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
	mux.Handle("GET /apis", s.authenticated(func(w http.ResponseWriter, _ *http.Request, _ user) { writeJSON(w, http.StatusOK, groupList()) }))
	mux.Handle("GET /apis/"+Group, s.authenticated(func(w http.ResponseWriter, _ *http.Request, _ user) { writeJSON(w, http.StatusOK, group()) }))
	mux.Handle("GET "+prefix, s.authenticated(func(w http.ResponseWriter, _ *http.Request, _ user) { writeJSON(w, http.StatusOK, resources()) }))
	vm := prefix + "/namespaces/{namespace}/virtualmachines/{name}/"
	for _, sub := range streams {
		mux.Handle("GET "+vm+sub, s.authenticated(s.stream))
	}
	for _, sub := range actions {
		mux.Handle("PUT "+vm+sub, s.authenticated(s.act))
	}
	mux.Handle("/", s.authenticated(func(w http.ResponseWriter, r *http.Request, _ user) {
		writeStatus(w, kerrors.NewNotFound(schema.GroupResource{Group: Group}, r.URL.Path))
	}))
	return mux
}

// authenticated lets through only requests the API server's front proxy
// made, with the user they act for.
func (s *Server) authenticated(h func(http.ResponseWriter, *http.Request, user)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u, err := s.front.Load().authenticate(r)
		if err != nil {
			writeStatus(w, kerrors.NewUnauthorized(err.Error()))
			return
		}
		h(w, r, u)
	})
}

func groupVersion() metav1.GroupVersionForDiscovery {
	return metav1.GroupVersionForDiscovery{GroupVersion: Group + "/" + Version, Version: Version}
}

func group() *metav1.APIGroup {
	return &metav1.APIGroup{
		TypeMeta:         metav1.TypeMeta{Kind: "APIGroup", APIVersion: "v1"},
		Name:             Group,
		Versions:         []metav1.GroupVersionForDiscovery{groupVersion()},
		PreferredVersion: groupVersion(),
	}
}

func groupList() *metav1.APIGroupList {
	return &metav1.APIGroupList{TypeMeta: metav1.TypeMeta{Kind: "APIGroupList", APIVersion: "v1"}, Groups: []metav1.APIGroup{*group()}}
}

// resources lists the subresources, so kubectl and the API server's
// discovery know them; there is no virtualmachines resource of this group.
func resources() *metav1.APIResourceList {
	l := &metav1.APIResourceList{TypeMeta: metav1.TypeMeta{Kind: "APIResourceList", APIVersion: "v1"}, GroupVersion: Group + "/" + Version}
	for _, sub := range streams {
		l.APIResources = append(l.APIResources, metav1.APIResource{Name: "virtualmachines/" + sub, Namespaced: true, Verbs: metav1.Verbs{"get"}})
	}
	for _, sub := range actions {
		l.APIResources = append(l.APIResources, metav1.APIResource{Name: "virtualmachines/" + sub, Namespaced: true, Verbs: metav1.Verbs{"update"}})
	}
	return l
}

// writeStatus writes err as the metav1.Status kubectl and client-go read
// their error messages from.
func writeStatus(w http.ResponseWriter, err error) {
	var st metav1.Status
	if s, ok := err.(kerrors.APIStatus); ok { //nolint:errorlint // the API's own errors are never wrapped here
		st = s.Status()
	} else {
		st = kerrors.NewInternalError(err).Status()
	}
	st.TypeMeta = metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}
	writeJSON(w, int(st.Code), &st)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}
