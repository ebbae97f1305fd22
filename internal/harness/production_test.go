// Package harness_test pins the rule this folder lives by: no production
// package imports a test server or harness. Production packages are hub/,
// agent/, apis/ and the shared production code of internal/ (natswire,
// flagenv), without the packages that exist only for tests (a name ending
// in "test", the driver's fake, and the simulated nodes of scale tests
// that run over it). The shipped hub and agent are built
// from them alone.
package harness_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const module = "github.com/virtfleet/virtfleet"

// testOnly is whether a virtfleet package exists only for tests.
func testOnly(pkg string) bool {
	return strings.HasPrefix(pkg, module+"/internal/harness/") || strings.HasPrefix(pkg, module+"/test/") ||
		strings.HasSuffix(pkg, "test") || pkg == module+"/agent/driver/fake" || pkg == module+"/agent/simnodes"
}

// forbidden are test servers and test libraries by import path prefix.
var forbidden = []string{
	"testing",
	"net/http/httptest",
	"github.com/stretchr/testify",
	"github.com/nats-io/nats-server",
	"sigs.k8s.io/controller-runtime/pkg/envtest",
	"sigs.k8s.io/controller-runtime/pkg/client/fake",
	"k8s.io/client-go/kubernetes/fake",
	module + "/bench",
	module + "/chaos",
	module + "/internal/build",
}

// testCode is whether pkg is test code: a virtfleet package only for tests,
// or one of forbidden.
func testCode(pkg string) bool {
	if strings.HasPrefix(pkg, module+"/") && testOnly(pkg) {
		return true
	}
	for _, f := range forbidden {
		if pkg == f || strings.HasPrefix(pkg, f+"/") {
			return true
		}
	}
	return false
}

func TestNoProductionPackageImportsTestCode(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("the go command is not on PATH, so imports cannot be listed")
	}
	out, err := exec.Command(gobin, "list", module+"/hub/...", module+"/agent/...", module+"/apis/...", module+"/internal/natswire/...", module+"/internal/flagenv/...").CombinedOutput() //nolint:gosec // fixed arguments
	require.NoError(t, err, "%s", out)
	var roots []string
	for _, pkg := range strings.Fields(string(out)) {
		if !testOnly(pkg) {
			roots = append(roots, pkg)
		}
	}
	require.Contains(t, roots, module+"/hub", "the hub command is production")
	require.Contains(t, roots, module+"/agent", "the agent command is production")

	// Every package the roots need, each with what it imports, so that a
	// failure names the production package that crosses into test code
	// (and not what test code imports in turn).
	out, err = exec.Command(gobin, append([]string{"list", "-deps", "-f", `{{.ImportPath}}: {{join .Imports " "}}`}, roots...)...).CombinedOutput() //nolint:gosec // our own package list
	require.NoError(t, err, "%s", out)
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	require.Greater(t, len(lines), len(roots), "the dependencies are listed")
	for _, line := range lines {
		pkg, imports, _ := strings.Cut(line, ": ")
		if testCode(pkg) {
			continue
		}
		for _, imp := range strings.Fields(imports) {
			assert.False(t, testCode(imp), "%s imports %s, which only tests may", pkg, imp)
		}
	}
}
