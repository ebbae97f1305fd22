// Package argocd_test runs virtfleet's Argo CD health check the way Argo CD
// runs its own resource_customizations: the Lua script in gopher-lua with the
// object as the global table obj, and each case of health_test.yaml (an input
// object and the expected status and message) checked against its result.
package argocd_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	lua "github.com/yuin/gopher-lua"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

const (
	scriptDir = "resource_customizations/compute.virtfleet.io/VirtualMachine"
	// cmKey is the argocd-cm key Argo CD reads a group_Kind health check from.
	cmKey = "resource.customizations.health.compute.virtfleet.io_VirtualMachine"
)

// Argo CD's health statuses (gitops-engine pkg/health).
var statuses = map[string]bool{"Healthy": true, "Progressing": true, "Degraded": true, "Suspended": true, "Missing": true, "Unknown": true}

type healthStatus struct {
	Status  string `json:"status"`
	Message string `json:"message"`
}

// TestHealth runs every case of health_test.yaml, Argo CD's format for
// testing a resource customization.
func TestHealth(t *testing.T) {
	script, err := os.ReadFile(filepath.Join(scriptDir, "health.lua"))
	require.NoError(t, err)
	b, err := os.ReadFile(filepath.Join(scriptDir, "health_test.yaml"))
	require.NoError(t, err)
	var spec struct {
		Tests []struct {
			HealthStatus healthStatus `json:"healthStatus"`
			InputPath    string       `json:"inputPath"`
		} `json:"tests"`
	}
	require.NoError(t, yaml.Unmarshal(b, &spec))
	require.NotEmpty(t, spec.Tests)

	seen := map[string]bool{}
	for _, tc := range spec.Tests {
		t.Run(tc.InputPath, func(t *testing.T) {
			in, err := os.ReadFile(filepath.Join(scriptDir, tc.InputPath))
			require.NoError(t, err)
			obj := &unstructured.Unstructured{}
			require.NoError(t, yaml.Unmarshal(in, &obj.Object))
			require.Equal(t, "VirtualMachine", obj.GetKind())
			got := runHealth(t, string(script), obj)
			assert.True(t, statuses[got.Status], "%q is not an Argo CD health status", got.Status)
			assert.Equal(t, tc.HealthStatus, got)
			seen[got.Status] = true
		})
	}
	for _, s := range []string{"Healthy", "Progressing", "Degraded", "Suspended"} {
		assert.True(t, seen[s], "no case expects %s", s)
	}
}

// TestHealthCheckInArgoCDConfigMap pins that the argocd-cm example carries the
// tested script, under the key Argo CD looks up.
func TestHealthCheckInArgoCDConfigMap(t *testing.T) {
	script, err := os.ReadFile(filepath.Join(scriptDir, "health.lua"))
	require.NoError(t, err)
	b, err := os.ReadFile("argocd-cm.yaml")
	require.NoError(t, err)
	cm := &corev1.ConfigMap{}
	require.NoError(t, yaml.UnmarshalStrict(b, cm))
	assert.Equal(t, "ConfigMap", cm.Kind)
	assert.Equal(t, "argocd-cm", cm.Name)
	assert.Equal(t, string(script), cm.Data[cmKey], "argocd-cm.yaml is out of date with health.lua")
}

// runHealth evaluates script with obj as Argo CD does (util/lua in argo-cd):
// a fresh state with the base, table, string and math libraries, obj set
// from the unstructured object, and the returned table read as a status.
func runHealth(t *testing.T, script string, obj *unstructured.Unstructured) healthStatus {
	t.Helper()
	L := lua.NewState(lua.Options{SkipOpenLibs: true})
	defer L.Close()
	for _, lib := range []struct {
		name string
		fn   lua.LGFunction
	}{{lua.BaseLibName, lua.OpenBase}, {lua.TabLibName, lua.OpenTable}, {lua.StringLibName, lua.OpenString}, {lua.MathLibName, lua.OpenMath}} {
		L.Push(L.NewFunction(lib.fn))
		L.Push(lua.LString(lib.name))
		L.Call(1, 0)
	}
	L.SetGlobal("obj", toLua(L, obj.Object))
	require.NoError(t, L.DoString(script))
	ret, ok := L.Get(-1).(*lua.LTable)
	require.True(t, ok, "the script returns a table, got %s", L.Get(-1).Type())
	return healthStatus{Status: lua.LVAsString(ret.RawGetString("status")), Message: lua.LVAsString(ret.RawGetString("message"))}
}

// toLua converts a JSON-shaped Go value into Lua values as Argo CD's
// decodeValue does: objects and arrays to tables (arrays 1-indexed), numbers
// to LNumber, nil to LNil.
func toLua(L *lua.LState, v any) lua.LValue {
	switch v := v.(type) {
	case map[string]any:
		t := L.NewTable()
		for k, e := range v {
			t.RawSetString(k, toLua(L, e))
		}
		return t
	case []any:
		t := L.NewTable()
		for _, e := range v {
			t.Append(toLua(L, e))
		}
		return t
	case string:
		return lua.LString(v)
	case bool:
		return lua.LBool(v)
	case int64:
		return lua.LNumber(v)
	case float64:
		return lua.LNumber(v)
	case nil:
		return lua.LNil
	default:
		panic("unexpected JSON value")
	}
}
