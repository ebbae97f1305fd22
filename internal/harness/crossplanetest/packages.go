package crossplanetest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	pkgv1 "github.com/crossplane/crossplane/apis/v2/pkg/v1"

	"github.com/virtfleet/virtfleet/internal/build/providerpackage"
)

// newPackage is an empty package object of kind.
func newPackage(kind, name string) (pkgv1.Package, error) {
	meta := metav1.ObjectMeta{Name: name}
	switch kind {
	case pkgv1.ProviderKind:
		return &pkgv1.Provider{ObjectMeta: meta}, nil
	case pkgv1.FunctionKind:
		return &pkgv1.Function{ObjectMeta: meta}, nil
	case pkgv1.ConfigurationKind:
		return &pkgv1.Configuration{ObjectMeta: meta}, nil
	}
	return nil, errors.Errorf("unknown package kind %q", kind)
}

// Install pushes each package to the registry as name:tag and installs it
// exactly as a user would, with a pkg.crossplane.io object whose
// spec.package is that reference, in order, waiting for each to be
// Installed (its CRDs, XRDs or Compositions established). The provider and
// function are not Healthy until their runtime says so (MarkRuntimeHealthy).
func (x *Crossplane) Install(ctx context.Context, tag string, pkgs []providerpackage.Package) error {
	for _, p := range pkgs {
		ref, err := x.Registry.Push(ctx, p.Name, tag, p.Image)
		if err != nil {
			return err
		}
		obj, err := newPackage(p.Kind, p.Name)
		if err != nil {
			return err
		}
		obj.SetSource(ref)
		if err := x.Client.Create(ctx, obj); err != nil {
			return errors.Wrapf(err, "cannot install %s %s", p.Kind, p.Name)
		}
		if p.Kind != pkgv1.ConfigurationKind {
			if err := x.serveTLS(ctx, p.Kind, p.Name); err != nil {
				return err
			}
		}
		if err := x.WaitPackage(ctx, p.Kind, p.Name, pkgv1.TypeInstalled, 3*time.Minute); err != nil {
			return err
		}
		fmt.Fprintf(x.prog, "  %-14s %s %s installed from %s\n", "crossplane", p.Kind, p.Name, ref)
	}
	return nil
}

// WaitPackage waits until the package's condition t is True.
func (x *Crossplane) WaitPackage(ctx context.Context, kind, name string, t xpv2.ConditionType, timeout time.Duration) error {
	obj, err := newPackage(kind, name)
	if err != nil {
		return err
	}
	return poll(ctx, timeout, fmt.Sprintf("%s %s %s", kind, name, t), func(ctx context.Context) (bool, string, error) {
		if err := x.Client.Get(ctx, client.ObjectKey{Name: name}, obj); err != nil {
			return false, err.Error(), nil
		}
		c := obj.GetCondition(t)
		return c.Status == corev1.ConditionTrue, fmt.Sprintf("%s=%s %s %s", c.Type, c.Status, c.Reason, c.Message), nil
	})
}

// activeRevision is the package's current revision, once there is one.
func (x *Crossplane) activeRevision(ctx context.Context, kind, name string) (pkgv1.PackageRevision, error) {
	obj, err := newPackage(kind, name)
	if err != nil {
		return nil, err
	}
	if err := x.Client.Get(ctx, client.ObjectKey{Name: name}, obj); err != nil {
		return nil, errors.Wrapf(err, "cannot get %s %s", kind, name)
	}
	rev := obj.GetCurrentRevision()
	if rev == "" {
		return nil, errors.Errorf("%s %s has no revision yet", kind, name)
	}
	var pr pkgv1.PackageRevision
	switch kind {
	case pkgv1.ProviderKind:
		pr = &pkgv1.ProviderRevision{}
	case pkgv1.FunctionKind:
		pr = &pkgv1.FunctionRevision{}
	default:
		return nil, errors.Errorf("a %s has no runtime", kind)
	}
	return pr, errors.Wrapf(x.Client.Get(ctx, client.ObjectKey{Name: rev}, pr), "cannot get %s", rev)
}

// MarkRuntimeHealthy says, as the External runtime, that the package's
// runtime runs: without it Crossplane never calls the package Healthy.
func (x *Crossplane) MarkRuntimeHealthy(ctx context.Context, kind, name string) error {
	return x.updateRevisionStatus(ctx, kind, name, func(pr pkgv1.PackageRevision) {
		pr.SetConditions(pkgv1.RuntimeHealthy())
	})
}

// updateRevisionStatus changes the active revision's status with mutate,
// retrying on conflicts with the package manager's own status writes.
func (x *Crossplane) updateRevisionStatus(ctx context.Context, kind, name string, mutate func(pkgv1.PackageRevision)) error {
	return poll(ctx, time.Minute, "updating the revision of "+kind+" "+name, func(ctx context.Context) (bool, string, error) {
		pr, err := x.activeRevision(ctx, kind, name)
		if err != nil {
			return false, err.Error(), nil
		}
		mutate(pr)
		if err := x.Client.Status().Update(ctx, pr); err != nil {
			if kerrors.IsConflict(err) {
				return false, err.Error(), nil
			}
			return false, "", errors.Wrap(err, "cannot update the revision's status")
		}
		return true, "", nil
	})
}

// RunFunction is the External runtime of the Function package name: it runs
// binary (the function's command) serving gRPC with mTLS on 127.0.0.1 — a
// server certificate for 127.0.0.1 signed by Crossplane's CA, which is how
// Crossplane authenticates functions and they it — and writes the address to
// the active FunctionRevision's status.endpoint, where Crossplane's function
// runner dials (the Deployment runtime writes a Service's DNS name there),
// and marks the runtime healthy. The function stops with Stop.
func (x *Crossplane) RunFunction(ctx context.Context, name, binary string) error {
	certs := filepath.Join(x.dir, "tls", name)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return errors.Wrap(err, "cannot find a port for the function")
	}
	addr := l.Addr().String()
	_ = l.Close()
	p, err := startProcess(name, filepath.Join(x.dir, "logs", name+".log"), nil, binary, "--address="+addr, "--tls-server-certs-dir="+certs, "--debug")
	if err != nil {
		return err
	}
	x.procs = append(x.procs, p)
	if err := poll(ctx, 30*time.Second, name+" serving mTLS on "+addr, func(context.Context) (bool, string, error) {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return false, err.Error(), nil
		}
		_ = c.Close()
		return true, "", nil
	}); err != nil {
		return err
	}
	if err := x.updateRevisionStatus(ctx, pkgv1.FunctionKind, name, func(pr pkgv1.PackageRevision) {
		pr.(*pkgv1.FunctionRevision).Status.Endpoint = addr //nolint:forcetypeassert // activeRevision returns a FunctionRevision for a Function
		pr.SetConditions(pkgv1.RuntimeHealthy())
	}); err != nil {
		return err
	}
	fmt.Fprintf(x.prog, "  %-14s %s on %s (mTLS), log: %s\n", "function", name, addr, p.log.Name())
	return nil
}

// serveTLS does for the package's active revision what the Deployment
// runtime does before Crossplane establishes the package's objects: a TLS
// server Secret in Crossplane's namespace, named in the revision's
// status.observedTLSServerSecretName. Crossplane's establisher refuses to
// install a Provider's or Function's CRDs until it is there ("waiting for
// package runtime controller to set revision's webhook TLS secret"), webhooks
// or not. The certificate (in dir tls/NAME) is the one RunFunction serves.
func (x *Crossplane) serveTLS(ctx context.Context, kind, name string) error {
	certs := filepath.Join(x.dir, "tls", name)
	if err := x.serverCertificate(ctx, certs); err != nil {
		return err
	}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: name + "-tls-server"}, Data: map[string][]byte{}}
	for _, k := range []string{corev1.TLSCertKey, corev1.TLSPrivateKeyKey, "ca.crt"} {
		b, err := os.ReadFile(filepath.Join(certs, k)) //nolint:gosec // written just above
		if err != nil {
			return errors.Wrapf(err, "cannot read %s", k)
		}
		secret.Data[k] = b
	}
	if err := x.Client.Create(ctx, secret); err != nil && !kerrors.IsAlreadyExists(err) {
		return errors.Wrap(err, "cannot store the runtime's TLS Secret")
	}
	return x.updateRevisionStatus(ctx, kind, name, func(pr pkgv1.PackageRevision) {
		pr.(pkgv1.PackageRevisionWithRuntime).SetObservedTLSServerSecretName(&secret.Name) //nolint:forcetypeassert // Providers and Functions have runtimes
	})
}

// serverCertificate writes tls.crt, tls.key (for 127.0.0.1, signed by
// Crossplane's CA) and ca.crt into dir.
func (x *Crossplane) serverCertificate(ctx context.Context, dir string) error {
	s := &corev1.Secret{}
	if err := x.Client.Get(ctx, client.ObjectKey{Namespace: Namespace, Name: caSecret}, s); err != nil {
		return errors.Wrap(err, "cannot read Crossplane's CA")
	}
	ca, err := tls.X509KeyPair(s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey])
	if err != nil {
		return errors.Wrap(err, "cannot parse Crossplane's CA")
	}
	caCert, err := x509.ParseCertificate(ca.Certificate[0])
	if err != nil {
		return errors.Wrap(err, "cannot parse Crossplane's CA certificate")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return errors.Wrap(err, "cannot generate a key")
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: "127.0.0.1"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:    time.Now().Add(-time.Minute),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, ca.PrivateKey)
	if err != nil {
		return errors.Wrap(err, "cannot sign the function's certificate")
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return errors.Wrap(err, "cannot encode the function's key")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return errors.Wrap(err, "cannot create the certificate directory")
	}
	files := map[string][]byte{
		corev1.TLSCertKey:       pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		corev1.TLSPrivateKeyKey: pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
		"ca.crt":                s.Data[corev1.TLSCertKey],
	}
	for f, b := range files {
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o600); err != nil {
			return errors.Wrapf(err, "cannot write %s", f)
		}
	}
	return nil
}

// ProviderIdentity gives the Provider package name the identity its
// runtime runs as, and returns a kubeconfig for it: the ServiceAccount
// Crossplane's Deployment runtime would create (named after the package, in
// Crossplane's namespace), bound to the system ClusterRole Crossplane's RBAC
// manager renders for the active revision. The RBAC manager binds that role
// only to ServiceAccounts of Deployments the revision owns, and the External
// runtime has none, so the binding is the runtime's job — made here the way
// the RBAC manager makes it.
func (x *Crossplane) ProviderIdentity(ctx context.Context, name string) (string, error) {
	pr, err := x.activeRevision(ctx, pkgv1.ProviderKind, name)
	if err != nil {
		return "", err
	}
	role := "crossplane:provider:" + pr.GetName() + ":system"
	if err := poll(ctx, 2*time.Minute, "the RBAC manager's ClusterRole "+role, func(ctx context.Context) (bool, string, error) {
		err := x.Client.Get(ctx, client.ObjectKey{Name: role}, &rbacv1.ClusterRole{})
		if err != nil {
			// Say what the RBAC manager renders the role from.
			cur, rerr := x.activeRevision(ctx, pkgv1.ProviderKind, name)
			if rerr != nil {
				return false, err.Error() + "; " + rerr.Error(), nil
			}
			return false, fmt.Sprintf("%v; the revision lists %d objects", err, len(cur.GetObjects())), nil
		}
		return true, "", nil
	}); err != nil {
		return "", err
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: name}}
	if err := x.Client.Create(ctx, sa); err != nil && !kerrors.IsAlreadyExists(err) {
		return "", errors.Wrap(err, "cannot create the provider's ServiceAccount")
	}
	// Not the role's own name: the RBAC manager owns a binding of that name
	// (with no subjects under the External runtime) and would undo ours.
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: role + ":external-runtime"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: Namespace, Name: name}},
	}
	if err := x.Client.Create(ctx, binding); err != nil && !kerrors.IsAlreadyExists(err) {
		return "", errors.Wrap(err, "cannot bind the provider's ClusterRole")
	}
	return x.cp.AddUser("system:serviceaccount:"+Namespace+":"+name, "system:serviceaccounts", "system:serviceaccounts:"+Namespace, "system:authenticated")
}
