// Package controllertest runs the hub's controllers as the hub does, for
// their tests: against a real kube-apiserver (internal/harness/controlplane)
// with the hub's field indexes, and a fleet over a real nats-server whose
// nodes' agents a test plays (NATS, Agent). Test code only.
package controllertest

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/crossplane/crossplane-runtime/v2/pkg/controller"
	"github.com/crossplane/crossplane-runtime/v2/pkg/event"
	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"
	"github.com/crossplane/crossplane-runtime/v2/pkg/ratelimiter"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	apisv1alpha1 "github.com/virtfleet/virtfleet/apis/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/controller/index"
	"github.com/virtfleet/virtfleet/hub/internal/fleet"
	"github.com/virtfleet/virtfleet/internal/harness/controlplane"
)

// NodeTTL is how long after its last heartbeat a node of an Env is lost.
const NodeTTL = 3 * time.Second

// Env is a control plane and a fleet, with controllers running against
// both.
type Env struct {
	// Kube reaches the API server directly, not through a cache: what a
	// test reads is what the server holds.
	Kube client.Client
	// Cache is the controllers' view of the API server (AwaitCachedGone).
	Cache client.Reader
	// Fleet is the one fleet every ProviderConfig names.
	Fleet *NATS
	// Pool hands out Fleet.
	Pool Pool
	// Ctx ends with the test.
	Ctx context.Context
	// CP is the control plane, for clients of users RBAC restricts.
	CP *controlplane.ControlPlane
}

// Pool is a pool of one fleet, whatever the target.
type Pool struct{ F *fleet.Fleet }

// Get returns the fleet.
func (p Pool) Get(context.Context, fleet.Target) (*fleet.Fleet, error) { return p.F, nil }

// Fleets returns the fleet.
func (p Pool) Fleets() []*fleet.Fleet { return []*fleet.Fleet{p.F} }

// Start starts a control plane with virtfleet's CRDs and the
// ClusterProviderConfig every VM names by default, a fleet of nodes, and a
// manager with the hub's field indexes, to which setup adds the
// controllers under test. It returns once the manager's cache has synced.
func Start(t *testing.T, nodes []string, setup func(mgr ctrl.Manager, o controller.Options, e *Env) error) *Env {
	t.Helper()
	return StartAllowing(t, nodes, nil, setup)
}

// StartAllowing is Start with a fleet that counts of each node's
// heartbeat what allowances allow (fleet.Fleet.WithAllowances) and hears
// no node before setup's controllers keep them (hypervisornode.Setup).
func StartAllowing(t *testing.T, nodes []string, allowances *fleet.Allowances, setup func(mgr ctrl.Manager, o controller.Options, e *Env) error) *Env {
	t.Helper()
	ctrl.SetLogger(logr.Discard())
	cp := controlplane.StartForTest(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	f := startNATS(t, NodeTTL, allowances, nodes)
	e := &Env{Kube: cp.Client, Fleet: f, Pool: Pool{F: f.Fleet}, Ctx: ctx, CP: cp}
	require.NoError(t, cp.Client.Create(ctx, &apisv1alpha1.ClusterProviderConfig{
		ObjectMeta: metav1.ObjectMeta{Name: "default"},
		Spec: apisv1alpha1.ClusterProviderConfigSpec{ProviderConfigSpec: apisv1alpha1.ProviderConfigSpec{
			NATSURL: f.URL, Credentials: apisv1alpha1.NATSCredentials{Source: xpv2.CredentialsSourceNone},
		}},
	}))
	mgr, err := ctrl.NewManager(cp.Config, ctrl.Options{
		Scheme:                 cp.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		// Each test's manager runs the same controllers anew.
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	})
	require.NoError(t, err)
	require.NoError(t, index.Setup(ctx, mgr))
	e.Cache = mgr.GetCache()
	o := controller.Options{
		Logger:                  logging.NewNopLogger(),
		MaxConcurrentReconciles: 4,
		PollInterval:            time.Minute,
		GlobalRateLimiter:       ratelimiter.NewGlobal(100),
	}
	require.NoError(t, setup(mgr, o, e))
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	require.True(t, mgr.GetCache().WaitForCacheSync(ctx), "the manager's cache syncs")
	return e
}

// Namespace creates a namespace for one test case, named after it.
func (e *Env) Namespace(t *testing.T) string {
	t.Helper()
	name := strings.ToLower(t.Name())
	name = strings.NewReplacer("/", "-", "_", "-").Replace(name)
	if len(name) > 63 {
		name = strings.TrimRight(name[len(name)-63:], "-")
	}
	name = strings.TrimLeft(name, "-")
	require.NoError(t, e.Kube.Create(e.Ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}))
	return name
}

// VM creates VM name in namespace with phase as its status. With node set,
// the VM is on that node, placed by the hub (sealed) if sealed, else by a
// hand that wrote the annotation.
func (e *Env) VM(t *testing.T, namespace, name, node string, sealed bool, phase v1alpha1.Phase) *v1alpha1.VirtualMachine {
	t.Helper()
	vm := &v1alpha1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}}
	vm.Spec.ForProvider = v1alpha1.VirtualMachineParameters{Vcpu: 1, Memory: resource.MustParse("1Gi"), DiskAttachments: []v1alpha1.DiskAttachment{{Name: "root"}}}
	require.NoError(t, e.Kube.Create(e.Ctx, vm))
	if node != "" {
		e.change(t, vm, func() error { return e.Kube.Update(e.Ctx, vm) }, func() {
			a := vm.GetAnnotations()
			if a == nil {
				a = map[string]string{}
			}
			a[v1alpha1.AnnotationNode] = node
			if sealed {
				a[v1alpha1.AnnotationSeal] = e.Fleet.Seal(string(vm.UID), node, "")
			}
			vm.SetAnnotations(a)
		})
	}
	e.change(t, vm, func() error { return e.Kube.Status().Update(e.Ctx, vm) }, func() { vm.Status.AtProvider.Phase = phase })
	return vm
}

// Bind binds o to node as the hub does, with the node annotation and its
// seal, written again over any write of a controller that came first (one
// taking o with its finalizer).
func (e *Env) Bind(t *testing.T, o client.Object, node string) {
	t.Helper()
	e.change(t, o, func() error { return e.Kube.Update(e.Ctx, o) }, func() {
		meta.AddAnnotations(o, map[string]string{v1alpha1.AnnotationNode: node, v1alpha1.AnnotationSeal: e.Fleet.Seal(string(o.GetUID()), node, "")})
	})
}

// change applies mutate to o and has write write it, reading o again and
// applying mutate anew whenever a controller of the test wrote o first (a
// scheduler may place a VM between its creation and a test's next write).
func (e *Env) change(t *testing.T, o client.Object, write func() error, mutate func()) {
	t.Helper()
	require.NoError(t, retry.RetryOnConflict(retry.DefaultRetry, func() error {
		mutate()
		err := write()
		if apierrors.IsConflict(err) {
			if gerr := e.Kube.Get(e.Ctx, client.ObjectKeyFromObject(o), o); gerr != nil {
				return gerr
			}
		}
		return err
	}))
}

// StorageQuota gives namespace a TenantQuota, named after it, of storage
// alone.
func (e *Env) StorageQuota(t *testing.T, namespace, storage string) {
	t.Helper()
	require.NoError(t, e.Kube.Create(e.Ctx, &apisv1alpha1.TenantQuota{
		ObjectMeta: metav1.ObjectMeta{Name: namespace},
		Spec:       apisv1alpha1.TenantQuotaSpec{Namespace: namespace, Hard: apisv1alpha1.QuotaAmounts{Storage: ptr.To(resource.MustParse(storage))}},
	}))
}

// Volume creates Volume name of size in namespace, on no node.
func (e *Env) Volume(t *testing.T, namespace, name, size string) *v1alpha1.Volume {
	t.Helper()
	v := &v1alpha1.Volume{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}}
	v.Spec.ForProvider.Size = resource.MustParse(size)
	require.NoError(t, e.Kube.Create(e.Ctx, v))
	return v
}

// Get reads o (by its namespace and name) from the API server.
func (e *Env) Get(t *testing.T, o client.Object) {
	t.Helper()
	require.NoError(t, e.Kube.Get(e.Ctx, client.ObjectKeyFromObject(o), o))
}

// Events are the reasons of the events recorded on o so far, by type:
// "Normal/SnapshotTaken".
func (e *Env) Events(t *testing.T, o client.Object) []string {
	t.Helper()
	l := &corev1.EventList{}
	require.NoError(t, e.Kube.List(e.Ctx, l, client.InNamespace(o.GetNamespace()), client.MatchingFields{"involvedObject.uid": string(o.GetUID())}))
	out := make([]string, 0, len(l.Items))
	for _, ev := range l.Items {
		out = append(out, fmt.Sprintf("%s/%s", ev.Type, ev.Reason))
	}
	return out
}

// EventMessage is the message of the event of type and reason recorded on
// o, or "" when there is none.
func (e *Env) EventMessage(t *testing.T, o client.Object, typ string, reason event.Reason) string {
	t.Helper()
	return e.Event(t, o, typ, reason).Message
}

// Event is the event of type and reason recorded on o, whose Count says
// how many times it was; the zero Event when there is none.
func (e *Env) Event(t *testing.T, o client.Object, typ string, reason event.Reason) corev1.Event {
	t.Helper()
	l := &corev1.EventList{}
	require.NoError(t, e.Kube.List(e.Ctx, l, client.InNamespace(o.GetNamespace()), client.MatchingFields{"involvedObject.uid": string(o.GetUID())}))
	for _, ev := range l.Items {
		if ev.Type == typ && ev.Reason == string(reason) {
			return ev
		}
	}
	return corev1.Event{}
}

// AwaitCachedGone waits until the controllers' cache no longer holds o,
// deleted by the test: a controller whose next read must not find o (the
// source of a refusal under test) otherwise may, for the cache learns of
// the deletion a moment after the API server made it.
func (e *Env) AwaitCachedGone(t *testing.T, o client.Object) {
	t.Helper()
	require.Eventually(t, func() bool {
		err := e.Cache.Get(e.Ctx, client.ObjectKeyFromObject(o), o.DeepCopyObject().(client.Object)) //nolint:forcetypeassert // a copy of an Object is one
		return apierrors.IsNotFound(err)
	}, 30*time.Second, 10*time.Millisecond, "the controllers' cache still holds %T %s", o, client.ObjectKeyFromObject(o))
}

// AwaitCached waits until the controllers' cache holds o as check wants
// it: a test that changed o and then makes what a controller judges by o
// (a snapshot of a VM it just marked as moving) otherwise races the
// cache, which learns of the change a moment after the API server made it.
func AwaitCached[T client.Object](t *testing.T, e *Env, o T, check func(cached T) bool) {
	t.Helper()
	cached := o.DeepCopyObject().(T) //nolint:forcetypeassert // a copy of a T is a T
	require.Eventually(t, func() bool {
		return e.Cache.Get(e.Ctx, client.ObjectKeyFromObject(o), cached) == nil && check(cached)
	}, 30*time.Second, 10*time.Millisecond, "the controllers' cache does not hold %T %s as the test wrote it", o, client.ObjectKeyFromObject(o))
}

// Await waits until o, read again from the API server, shows what check
// asserts, and returns what it read.
func Await[T client.Object](t *testing.T, e *Env, o T, within time.Duration, check func(c *assert.CollectT, got T)) T {
	t.Helper()
	got := o.DeepCopyObject().(T) //nolint:forcetypeassert // a copy of a T is a T
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		if assert.NoError(c, e.Kube.Get(e.Ctx, client.ObjectKeyFromObject(o), got)) {
			check(c, got)
		}
	}, within, 10*time.Millisecond)
	return got
}
