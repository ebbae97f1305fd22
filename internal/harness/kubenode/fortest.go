package kubenode

import (
	"context"
	"net"
	"net/netip"
	"net/url"
	"path/filepath"
	"runtime"
	"strconv"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/internal/build/ociimage"
	"github.com/virtfleet/virtfleet/internal/harness/controlplane"
	"github.com/virtfleet/virtfleet/internal/harness/crossplanetest"
	"github.com/virtfleet/virtfleet/internal/harness/envtestassets"
)

// Pause is the image of the pause command (./pause): the node's sandbox
// image, and a program for test pods.
var Pause = ociimage.Spec{
	Name:      "pause",
	GoPackage: "./internal/harness/kubenode/pause",
	Path:      "/pause",
	// Kubernetes' pause image runs as this user too.
	User: "65535:65535",
}

// PushPause builds the pause image and pushes it to reg, returning its
// reference.
func PushPause(ctx context.Context, reg *crossplanetest.Registry, dir string) (string, error) {
	p := ociimage.Platform{OS: "linux", Arch: runtime.GOARCH}
	img, err := ociimage.BuildFromSource(ctx, controlplane.RepoRoot(), Pause, filepath.Join(dir, "pause"), p, time.Unix(0, 0).UTC())
	if err != nil {
		return "", err
	}
	return reg.Push(ctx, "virtfleet/pause", "test", img)
}

// StartForTest starts node name for t: it builds the kubelet once per
// machine, pushes the pause image to reg, gives the node an identity cp
// authenticates (user system:node:<name>, bound to the system:node
// ClusterRole, as envtest's API server authorizes by RBAC alone) and
// stops it when t ends, saying how it fared if t failed. Each of set may
// add to the node's Options (ports to forward, host paths). It returns the
// node and the pause image's reference.
func StartForTest(t testing.TB, cp *controlplane.ControlPlane, reg *crossplanetest.Registry, name string, set ...func(*Options)) (*Node, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	progress := testWriter{t}
	kubelet, err := envtestassets.EnsureNode(ctx, progress)
	if err != nil {
		t.Fatalf("cannot build the kubelet: %v", err)
	}
	pause, err := PushPause(ctx, reg, t.TempDir())
	if err != nil {
		t.Fatalf("cannot push the pause image: %v", err)
	}
	kubeconfig, err := identity(ctx, cp, "kubenode:"+name, "system:node", "system:node:"+name, "system:nodes")
	if err != nil {
		t.Fatal(err)
	}
	// Every node's kube-proxy is one user, as kubeadm makes it.
	proxyKubeconfig, err := identity(ctx, cp, "kubenode:kube-proxy", "system:node-proxier", "system:kube-proxy")
	if err != nil {
		t.Fatal(err)
	}
	ports, err := loopbackPorts(cp.Config.Host, "https://"+reg.Host)
	if err != nil {
		t.Fatal(err)
	}
	opts := Options{
		Name:            name,
		Kubelet:         filepath.Join(kubelet, "kubelet"),
		Kubeconfig:      kubeconfig,
		KubeProxy:       filepath.Join(kubelet, "kube-proxy"),
		ProxyKubeconfig: proxyKubeconfig,
		Forward:         ports,
		SandboxImage:    pause,
		Registries:      []string{reg.Host, PodsReach(reg.Host)},
		Progress:        progress,
	}
	for _, s := range set {
		s(&opts)
	}
	n, err := Start(ctx, opts)
	if err != nil {
		t.Fatalf("cannot start node %s: %v", name, err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(n.Describe())
		}
		n.Stop()
	})
	// The API server reaches the node's pods and its kubelet, when it
	// routes the cluster's network (controlplane.Options.ClusterEgress),
	// through the node's namespace, as a real API server reaches them over
	// the cluster's network.
	// Every node has NodeIP: the API server reaches the first's.
	unroute, err := cp.RouteCluster(n.Dial, n.PodSubnet, netip.PrefixFrom(netip.MustParseAddr(NodeIP), 32))
	if err != nil {
		unroute, err = cp.RouteCluster(n.Dial, n.PodSubnet)
	}
	if err != nil {
		t.Fatalf("cannot route the API server to node %s: %v", name, err)
	}
	t.Cleanup(unroute)
	return n, pause
}

// identity makes user (in groups) on cp, bound to ClusterRole role by the
// ClusterRoleBinding binding, which may exist already (one user for every
// node), and returns a kubeconfig of the user.
func identity(ctx context.Context, cp *controlplane.ControlPlane, binding, role, user string, groups ...string) (string, error) {
	kubeconfig, err := cp.AddUser(user, groups...)
	if err != nil {
		return "", errors.Wrapf(err, "cannot make the identity %s", user)
	}
	b := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: binding},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
	}
	if err := cp.Client.Create(ctx, b); err != nil && !kerrors.IsAlreadyExists(err) {
		return "", errors.Wrapf(err, "cannot bind %s's role %s", user, role)
	}
	return kubeconfig, nil
}

// loopbackPorts are the ports of URLs, which must name 127.0.0.1.
func loopbackPorts(urls ...string) ([]int, error) {
	ports := make([]int, 0, len(urls))
	for _, s := range urls {
		u, err := url.Parse(s)
		if err != nil {
			return nil, errors.Wrapf(err, "cannot parse %s", s)
		}
		if ip := net.ParseIP(u.Hostname()); ip == nil || !ip.IsLoopback() {
			return nil, errors.Errorf("%s is not on loopback, which is all a node reaches", s)
		}
		p, err := strconv.Atoi(u.Port())
		if err != nil {
			return nil, errors.Wrapf(err, "%s names no port", s)
		}
		ports = append(ports, p)
	}
	return ports, nil
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}
