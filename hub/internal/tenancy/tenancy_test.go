package tenancy

import (
	"testing"

	"github.com/stretchr/testify/assert"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	apisv1alpha1 "github.com/virtfleet/virtfleet/apis/v1alpha1"
)

func cpc(grants ...apisv1alpha1.TenantGrant) apisv1alpha1.ClusterProviderConfig {
	return apisv1alpha1.ClusterProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: "c"}, Spec: apisv1alpha1.ClusterProviderConfigSpec{Grants: grants}}
}

func TestFor(t *testing.T) {
	cases := map[string]struct {
		cpcs      []apisv1alpha1.ClusterProviderConfig
		namespace string
		want      Grant
	}{
		"NoGrantsGrantNothing": {
			cpcs:      []apisv1alpha1.ClusterProviderConfig{cpc()},
			namespace: "tenant-a",
			want:      Grant{Namespace: "tenant-a"},
		},
		"AGrantForAnotherNamespaceGrantsNothing": {
			cpcs:      []apisv1alpha1.ClusterProviderConfig{cpc(apisv1alpha1.TenantGrant{Namespaces: []string{"ops"}, Import: true, ChooseNode: true, HostBridges: []string{"br0"}, ImageSources: []string{"10.0.0.0/8"}})},
			namespace: "tenant-a",
			want:      Grant{Namespace: "tenant-a"},
		},
		"GrantsNamingTheNamespaceAddUpAcrossConfigs": {
			cpcs: []apisv1alpha1.ClusterProviderConfig{
				cpc(apisv1alpha1.TenantGrant{Namespaces: []string{"ops", "tenant-a"}, Import: true, HostBridges: []string{"br0"}}),
				cpc(apisv1alpha1.TenantGrant{Namespaces: []string{"tenant-a"}, HostBridges: []string{"br0", "br1"}, ImageSources: []string{"10.0.0.0/8"}, RestoreFrom: []string{"gone"}, NetworkCIDRs: []string{"10.20.0.0/16"}}),
				cpc(apisv1alpha1.TenantGrant{Namespaces: []string{"*"}, NetworkCIDRs: []string{"10.30.0.0/16"}}),
			},
			namespace: "tenant-a",
			want:      Grant{Namespace: "tenant-a", Import: true, HostBridges: []string{"br0", "br1"}, ImageSources: []string{"10.0.0.0/8"}, RestoreFrom: []string{"gone"}, NetworkCIDRs: []string{"10.20.0.0/16", "10.30.0.0/16"}},
		},
		"AStarGrantsEveryNamespace": {
			cpcs:      []apisv1alpha1.ClusterProviderConfig{cpc(apisv1alpha1.TenantGrant{Namespaces: []string{"*"}, ChooseNode: true})},
			namespace: "anything",
			want:      Grant{Namespace: "anything", ChooseNode: true},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			assert.Equal(t, tc.want, For(tc.cpcs, tc.namespace))
		})
	}
}

func TestChecks(t *testing.T) {
	none := Grant{Namespace: "tenant-a"}
	all := Grant{Namespace: "ops", Import: true, ChooseNode: true, HostBridges: []string{"br0"}, BackupLocations: []string{"offsite"}, RestoreFrom: []string{"gone"}}
	any := Grant{Namespace: "ops", HostBridges: []string{"*"}, BackupLocations: []string{"*"}, RestoreFrom: []string{"*"}}
	confined := Grant{Namespace: "tenant-a", NetworkCIDRs: []string{"10.20.0.0/16", "192.168.7.0/24"}}
	cases := map[string]struct {
		err     error
		refused bool
		says    string
	}{
		"ImportRefusedWithoutTheGrant":   {err: none.CheckImport("VirtualMachine", "vault-01"), refused: true, says: `refused: the VirtualMachine imports "vault-01" by crossplane.io/external-name, which virtfleet did not make for it; namespace tenant-a may not reach what it does not own unless a cluster administrator grants it in a ClusterProviderConfig's spec.grants (import: true)`},
		"ImportAllowedWithIt":            {err: all.CheckImport("VirtualMachine", "vault-01")},
		"NodeRefusedWithoutTheGrant":     {err: none.CheckNode("VirtualMachine", "node1"), refused: true, says: "(chooseNode: true)"},
		"NodeAllowedWithIt":              {err: all.CheckNode("VirtualMachine", "node1")},
		"ABridgeNotListedIsRefused":      {err: all.CheckBridge("br-mgmt"), refused: true, says: `joins host bridge "br-mgmt"`},
		"ABridgeListedIsAllowed":         {err: all.CheckBridge("br0")},
		"AStarAllowsEveryBridge":         {err: any.CheckBridge("br-mgmt")},
		"NoBridgesWithoutTheGrant":       {err: none.CheckBridge("br0"), refused: true, says: "(hostBridges: [br0])"},
		"ALocationNotListedIsRefused":    {err: all.CheckBackupLocation("other"), refused: true, says: `names BackupLocation "other"`},
		"ALocationListedIsAllowed":       {err: all.CheckBackupLocation("offsite")},
		"AStarAllowsEveryLocation":       {err: any.CheckBackupLocation("other")},
		"NoLocationWithoutTheGrant":      {err: none.CheckBackupLocation("offsite"), refused: true, says: "(backupLocations: [offsite])"},
		"ItsOwnBackupsNeedNoGrant":       {err: none.CheckRestoreFrom("tenant-a")},
		"AnotherNamespacesBackupsNeedIt": {err: none.CheckRestoreFrom("tenant-b"), refused: true, says: `restores a backup of namespace "tenant-b"`},
		"ANamespaceListedMayBeRestored":  {err: all.CheckRestoreFrom("gone")},
		"ANamespaceNotListedMayNot":      {err: all.CheckRestoreFrom("tenant-b"), refused: true, says: "(restoreFrom: [tenant-b])"},
		"AStarAllowsEveryNamespace":      {err: any.CheckRestoreFrom("tenant-b")},
		"AnyCIDRWhileNothingConfines":    {err: none.CheckCIDR("db", "172.31.0.0/16")},
		"ACIDRInsideAGrantedRange":       {err: confined.CheckCIDR("db", "10.20.4.0/24")},
		"AGrantedRangeItself":            {err: confined.CheckCIDR("db", "192.168.7.0/24")},
		"ACIDRWiderThanTheRange":         {err: confined.CheckCIDR("db", "10.0.0.0/8"), refused: true, says: "spec.forProvider.cidr 10.0.0.0/8 lies outside the ranges granted to the namespace (10.20.0.0/16, 192.168.7.0/24)"},
		"ACIDRAcrossTwoRanges":           {err: confined.CheckCIDR("db", "192.168.6.0/23"), refused: true, says: "(networkCIDRs: [192.168.6.0/23])"},
		"ACIDRElsewhere":                 {err: confined.CheckCIDR("db", "10.96.0.0/24"), refused: true, says: "VirtualNetwork db's spec.forProvider.cidr 10.96.0.0/24"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if !tc.refused {
				assert.NoError(t, tc.err)
				return
			}
			var r *RefusedError
			assert.ErrorAs(t, tc.err, &r)
			assert.Contains(t, tc.err.Error(), tc.says)
		})
	}
}
