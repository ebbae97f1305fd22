package stack

import (
	"cmp"
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"

	apisv1alpha1 "github.com/virtfleet/virtfleet/apis/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/flagenv"
	"github.com/virtfleet/virtfleet/internal/harness/controlplane"
	"github.com/virtfleet/virtfleet/internal/memlimit"
	"github.com/virtfleet/virtfleet/internal/natswire"
)

// Where the hub's NATS credentials live, as examples/providerconfig names them.
const (
	SystemNamespace = "virtfleet-system"
	HubSecretName   = "hub-nats-credentials"
	HubSecretKey    = "hub.nk"
)

// StartHub starts the hub.
func (s *Stack) StartHub() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.hub != nil {
		return errors.New("the hub is already running")
	}
	metrics, err := s.keptPort(metricsPort, "hub")
	if err != nil {
		return err
	}
	args := []string{fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", metrics), "--health-probe-bind-address=0", "--poll=" + cmp.Or(s.opts.PollInterval, 30*time.Second).String()}
	if s.opts.Pprof {
		arg, err := s.pprofArg("hub")
		if err != nil {
			return err
		}
		args = append(args, arg)
	}
	if s.opts.NodeTTL > 0 {
		args = append(args, "--node-ttl="+s.opts.NodeTTL.String())
	}
	if s.opts.FencingTimeout > 0 {
		args = append(args, "--fencing-timeout="+s.opts.FencingTimeout.String())
	}
	if s.opts.FencingMargin > 0 {
		args = append(args, "--fencing-margin="+s.opts.FencingMargin.String())
	}
	if s.opts.StraySweep > 0 {
		args = append(args, "--stray-sweep-interval="+s.opts.StraySweep.String())
	}
	if s.opts.Debug {
		args = append(args, "--debug")
	}
	if s.apiPort != 0 {
		args = append(args, fmt.Sprintf("--api-bind-address=127.0.0.1:%d", s.apiPort))
	}
	c, err := s.run("hub", "hub", s.hubEnv(), args...)
	s.hub = c
	return err
}

// hubEnv is what the hub's environment has besides the stack's own: its
// kubeconfig and, under Options.HubMemoryLimit, its memory limit, set as
// cluster/deploy sets it.
func (s *Stack) hubEnv() []string {
	env := []string{"KUBECONFIG=" + s.hubKubeconfig}
	if s.opts.HubMemoryLimit > 0 {
		env = append(env, flagenv.Name(memlimit.FlagName)+"="+strconv.FormatInt(s.opts.HubMemoryLimit, 10))
	}
	return env
}

// StopHub stops the hub cleanly (SIGTERM) and waits for it.
func (s *Stack) StopHub() error { return s.stopHub(syscall.SIGTERM) }

// KillHub kills the hub with SIGKILL, as a crash would.
func (s *Stack) KillHub() { _ = s.stopHub(syscall.SIGKILL) }

func (s *Stack) stopHub(sig syscall.Signal) error {
	s.mu.Lock()
	c := s.hub
	s.hub = nil
	s.mu.Unlock()
	if c == nil {
		return nil
	}
	return c.stop(sig)
}

// configureProvider stores the hub's NATS credentials and the
// ClusterProviderConfig named default that points at this stack's NATS. Both
// are updated when a kept run directory already has them.
func (s *Stack) configureProvider(ctx context.Context) error {
	kube := s.ControlPlane.Client
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: SystemNamespace}}
	if err := kube.Create(ctx, ns); err != nil && !kerrors.IsAlreadyExists(err) {
		return errors.Wrap(err, "cannot create the system namespace")
	}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: SystemNamespace, Name: HubSecretName}}
	if _, err := controllerutil.CreateOrUpdate(ctx, kube, secret, func() error {
		secret.Data = map[string][]byte{HubSecretKey: s.hubID.Seed}
		return nil
	}); err != nil {
		return errors.Wrap(err, "cannot store the hub's NATS credentials")
	}
	cpc := &apisv1alpha1.ClusterProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: "default"}}
	_, err := controllerutil.CreateOrUpdate(ctx, kube, cpc, func() error {
		cpc.Spec.Grants = s.opts.Grants
		if cpc.Spec.Grants == nil {
			cpc.Spec.Grants = DefaultGrants
		}
		cpc.Spec.ProviderConfigSpec = apisv1alpha1.ProviderConfigSpec{
			NATSURL:      s.NATSURL(),
			Replicas:     max(s.opts.NATSCluster, 1),
			NodeSelector: s.opts.DefaultNodeSelector,
			Credentials: apisv1alpha1.NATSCredentials{
				Source: xpv2.CredentialsSourceSecret,
				CommonCredentialSelectors: xpv2.CommonCredentialSelectors{SecretRef: &xpv2.SecretKeySelector{
					SecretReference: xpv2.SecretReference{Namespace: SystemNamespace, Name: HubSecretName},
					Key:             HubSecretKey,
				}},
			},
		}
		return nil
	})
	return errors.Wrap(err, "cannot configure the default ClusterProviderConfig")
}

// HubServiceAccount is the ServiceAccount cluster/deploy runs the hub as.
const HubServiceAccount = "system:serviceaccount:" + SystemNamespace + ":virtfleet-hub"

// hubIdentity applies the hub's ClusterRole and ClusterRoleBinding from
// cluster/deploy and returns a kubeconfig that authenticates as the
// ServiceAccount they bind, so every test of the stack also proves the
// deployed hub's RBAC is enough (and the hub asks for nothing more).
func (s *Stack) hubIdentity(ctx context.Context) (string, error) {
	dir := filepath.Join(controlplane.RepoRoot(), "cluster", "deploy", "hub")
	if _, err := s.ControlPlane.Apply(ctx, filepath.Join(dir, "clusterrole.yaml"), filepath.Join(dir, "clusterrolebinding.yaml")); err != nil {
		return "", errors.Wrap(err, "cannot grant the hub its RBAC")
	}
	return s.ControlPlane.AddUser(HubServiceAccount, "system:serviceaccounts", "system:serviceaccounts:"+SystemNamespace, "system:authenticated")
}

// HubIdentity is the hub's NATS identity, for tests that read the buckets
// as the hub does.
func (s *Stack) HubIdentity() natswire.Identity { return s.hubID }

// HubKubeconfig is the kubeconfig the hub runs with.
func (s *Stack) HubKubeconfig() string { return s.hubKubeconfig }
