package kubenode

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/internal/build/ociimage"
	"github.com/virtfleet/virtfleet/internal/harness/controlplane"
	"github.com/virtfleet/virtfleet/internal/harness/crossplanetest"
	"github.com/virtfleet/virtfleet/internal/harness/envtestassets"
)

// ClusterDNS is the cluster DNS Service's address, which every node's
// kubelet gives its pods as their name server: in the API server's
// Service range (controlplane.ServiceRange), at the tenth address as
// kubeadm puts it.
const ClusterDNS = "10.0.0.10"

// dnsPort is where CoreDNS listens in its pod: above 1024, so that it runs
// without a capability; the Service maps port 53 to it.
const dnsPort = 1053

// corefile is CoreDNS's configuration as kubeadm's, without an upstream:
// the cluster's names only, answered from the API server's Services and
// EndpointSlices.
var corefile = `.:` + strconv.Itoa(dnsPort) + ` {
    errors
    ready :8181
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }
    cache 30
}
`

// StartClusterDNS runs the cluster's DNS on cp's nodes for t as kubeadm
// deploys it: CoreDNS (built once per machine by envtestassets, its image
// pushed to reg) as the Deployment coredns in kube-system with its
// ServiceAccount and ClusterRole, behind the Service kube-dns at
// ClusterDNS. It returns once a CoreDNS pod is Ready; kube-proxy
// (StartForTest's nodes run it) makes the Service reach it.
//
// CoreDNS reaches the API server as any in-cluster client does, by the
// kubernetes Service, with its ServiceAccount's token: cp must be started
// with an InClusterAddress.
func StartClusterDNS(t testing.TB, cp *controlplane.ControlPlane, reg *crossplanetest.Registry) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	if cp.InClusterCA == "" {
		t.Fatal("pods reach the API server by the kubernetes Service: start the control plane with an InClusterAddress")
	}
	bin, err := envtestassets.EnsureNode(ctx, testWriter{t})
	if err != nil {
		t.Fatalf("cannot build CoreDNS: %v", err)
	}
	image, err := pushCoreDNS(ctx, reg, filepath.Join(bin, "coredns"))
	if err != nil {
		t.Fatal(err)
	}
	for _, obj := range dnsObjects(image) {
		if err := cp.Client.Create(ctx, obj); err != nil {
			t.Fatalf("cannot create the cluster DNS's %T %s: %v", obj, obj.GetName(), err)
		}
	}
	var d appsv1.Deployment
	err = wait.PollUntilContextCancel(ctx, time.Second, true, func(ctx context.Context) (bool, error) {
		if err := cp.Client.Get(ctx, client.ObjectKey{Namespace: metav1.NamespaceSystem, Name: "coredns"}, &d); err != nil {
			return false, err
		}
		return d.Status.ReadyReplicas > 0, nil
	})
	if err != nil {
		t.Fatalf("CoreDNS is not Ready: %v; its Deployment's status: %+v", err, d.Status)
	}
}

// pushCoreDNS makes CoreDNS's image from the binary and pushes it to reg.
func pushCoreDNS(ctx context.Context, reg *crossplanetest.Registry, binary string) (string, error) {
	b, err := os.ReadFile(binary) //nolint:gosec // the cache's own build
	if err != nil {
		return "", errors.Wrap(err, "cannot read CoreDNS")
	}
	spec := ociimage.Spec{Name: "coredns", Path: "/coredns", User: ociimage.NonRootUser}
	img, err := ociimage.Build(spec, b, ociimage.Platform{OS: "linux", Arch: runtime.GOARCH}, time.Unix(0, 0).UTC())
	if err != nil {
		return "", err
	}
	return reg.Push(ctx, "virtfleet/coredns", envtestassets.CoreDNSVersion, img)
}

// dnsObjects are the cluster DNS's objects, its pods running image.
func dnsObjects(image string) []client.Object {
	ns := metav1.NamespaceSystem
	labels := map[string]string{"k8s-app": "kube-dns"}
	return []client.Object{
		&rbacv1.ClusterRole{
			ObjectMeta: metav1.ObjectMeta{Name: "system:coredns"},
			Rules: []rbacv1.PolicyRule{
				{APIGroups: []string{""}, Resources: []string{"endpoints", "services", "pods", "namespaces"}, Verbs: []string{"list", "watch"}},
				{APIGroups: []string{discoveryv1.GroupName}, Resources: []string{"endpointslices"}, Verbs: []string{"list", "watch"}},
			},
		},
		&rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "system:coredns"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:coredns"},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: "coredns"}},
		},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "coredns"}},
		&corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "coredns"},
			Data:       map[string]string{"Corefile": corefile},
		},
		&appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "coredns", Labels: labels},
			Spec: appsv1.DeploymentSpec{
				Replicas: ptr.To[int32](1),
				Selector: &metav1.LabelSelector{MatchLabels: labels},
				Template: corev1.PodTemplateSpec{
					ObjectMeta: metav1.ObjectMeta{Labels: labels},
					Spec: corev1.PodSpec{
						ServiceAccountName: "coredns",
						// Its own name server is itself: the node's.
						DNSPolicy: corev1.DNSDefault,
						Containers: []corev1.Container{{
							Name:  "coredns",
							Image: image,
							Args:  []string{"-conf", "/etc/coredns/Corefile"},
							Ports: []corev1.ContainerPort{
								{Name: "dns", ContainerPort: dnsPort, Protocol: corev1.ProtocolUDP},
								{Name: "dns-tcp", ContainerPort: dnsPort, Protocol: corev1.ProtocolTCP},
							},
							ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
								Path: "/ready", Port: intstr.FromInt32(8181),
							}}, PeriodSeconds: 2},
							VolumeMounts: []corev1.VolumeMount{{Name: "config", MountPath: "/etc/coredns", ReadOnly: true}},
							SecurityContext: &corev1.SecurityContext{
								AllowPrivilegeEscalation: ptr.To(false),
								ReadOnlyRootFilesystem:   ptr.To(true),
								Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
							},
						}},
						Volumes: []corev1.Volume{{Name: "config", VolumeSource: corev1.VolumeSource{
							ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "coredns"}},
						}}},
					},
				},
			},
		},
		&corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "kube-dns", Labels: labels},
			Spec: corev1.ServiceSpec{
				ClusterIP: ClusterDNS,
				Selector:  labels,
				Ports: []corev1.ServicePort{
					{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP, TargetPort: intstr.FromInt32(dnsPort)},
					{Name: "dns-tcp", Port: 53, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(dnsPort)},
				},
			},
		},
	}
}
