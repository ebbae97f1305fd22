package controlplane_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/virtfleet/virtfleet/internal/harness/controlplane"
)

// TestAwaitAllowedReturnsOnceTheUserMayAct pins the wait tests take after
// granting a user rights: it does not return while the user may not act,
// and once it returned the user's request is allowed.
func TestAwaitAllowedReturnsOnceTheUserMayAct(t *testing.T) {
	if testing.Short() {
		t.Skip("runs etcd and kube-apiserver; skipped with -short")
	}
	ctx := context.Background()
	cp := controlplane.StartForTest(t)
	const user, ns = "carol", "default"
	carol, err := cp.UserClient(user)
	require.NoError(t, err)
	createConfigMaps := authorizationv1.ResourceAttributes{Namespace: ns, Verb: "create", Resource: "configmaps"}
	create := func() error {
		return carol.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, GenerateName: "carols-"}})
	}

	short, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	assert.Error(t, cp.AwaitAllowed(short, user, createConfigMaps), "carol has no rights yet")
	assert.True(t, kerrors.IsForbidden(create()), "carol's create is refused")

	require.NoError(t, cp.Client.Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "configmaps"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"create"}}},
	}))
	require.NoError(t, cp.Client.Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: user},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "configmaps"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
	}))
	require.NoError(t, cp.AwaitAllowed(ctx, user, createConfigMaps))
	assert.NoError(t, create(), "carol may create once AwaitAllowed returned")
}
