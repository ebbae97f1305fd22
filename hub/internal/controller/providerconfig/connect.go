package providerconfig

import (
	"context"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/crossplane/crossplane-runtime/v2/pkg/controller"
	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"
	"github.com/crossplane/crossplane-runtime/v2/pkg/resource"

	apisv1alpha1 "github.com/virtfleet/virtfleet/apis/v1alpha1"
	"github.com/virtfleet/virtfleet/hub/internal/fleet"
)

// Fleets connects to a NATS server, creating its buckets; *fleet.Pool is one.
type Fleets interface {
	Get(ctx context.Context, t fleet.Target) (*fleet.Fleet, error)
}

// SetupConnectors adds a controller per kind that connects the hub to the
// NATS server of every ProviderConfig and ClusterProviderConfig as soon as
// it exists — at the hub's start and whenever one appears — which creates
// the buckets. Agents can then heartbeat before the first VM is created, so
// the first VMs are placed over every node, not over whichever connected
// first. A server that cannot be reached is retried with backoff.
func SetupConnectors(mgr ctrl.Manager, o controller.Options, pool Fleets) error {
	for _, k := range configKinds {
		name := "connect/" + k.groupKind
		c := &connector{kube: mgr.GetClient(), pool: pool, log: o.Logger.WithValues("controller", name), new: k.new, spec: k.spec}
		err := ctrl.NewControllerManagedBy(mgr).
			Named(name).
			For(k.new()).
			Complete(c)
		if err != nil {
			return errors.Wrapf(err, "cannot set up the %s controller", name)
		}
	}
	return nil
}

// connector connects to one kind of ProviderConfig's NATS servers.
type connector struct {
	kube client.Client
	pool Fleets
	log  logging.Logger
	new  func() resource.ProviderConfig
	spec func(client.Object) apisv1alpha1.ProviderConfigSpec
}

// Reconcile connects to the NATS server the ProviderConfig names; the Pool
// keeps the connection for the hub's lifetime, so a second reconcile of the
// same server changes nothing.
func (c *connector) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	pc := c.new()
	if err := c.kube.Get(ctx, req.NamespacedName, pc); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if meta.WasDeleted(pc) {
		return reconcile.Result{}, nil
	}
	spec, err := Tenanted(ctx, c.kube, c.spec(pc), pc.GetNamespace())
	if err != nil {
		c.log.Info("Cannot connect to NATS", "name", req.Name, "namespace", req.Namespace, "error", err)
		return reconcile.Result{}, nil
	}
	t, err := TargetOf(ctx, c.kube, spec)
	t.Namespace = pc.GetNamespace()
	if err == nil {
		_, err = c.pool.Get(ctx, t)
	}
	if err != nil {
		return reconcile.Result{}, errors.Wrapf(err, "cannot connect to the NATS server of %s", req.String())
	}
	c.log.Debug("Connected to NATS", "name", req.String(), "url", t.URL, "replicas", t.Replicas)
	return reconcile.Result{}, nil
}
