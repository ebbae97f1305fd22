package controlplane

import (
	"os"
	"path/filepath"
	"strings"

	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
)

// AddUser writes a kubeconfig for a user the API server authenticates by a
// client certificate with the given name and groups, next to the admin's, and
// returns its path. The user may do what RBAC grants the name and groups,
// nothing more: a ServiceAccount's rights are had with the name
// "system:serviceaccount:<namespace>:<name>".
func (cp *ControlPlane) AddUser(name string, groups ...string) (string, error) {
	u, err := cp.env.AddUser(envtest.User{Name: name, Groups: groups}, nil)
	if err != nil {
		return "", errors.Wrapf(err, "cannot create user %s", name)
	}
	b, err := u.KubeConfig()
	if err != nil {
		return "", errors.Wrapf(err, "cannot render the kubeconfig of %s", name)
	}
	path := filepath.Join(filepath.Dir(cp.Kubeconfig), "kubeconfig-"+strings.NewReplacer(":", "-", "/", "-").Replace(name))
	if err := os.WriteFile(path, b, 0o600); err != nil {
		return "", errors.Wrapf(err, "cannot write the kubeconfig of %s", name)
	}
	return path, nil
}
