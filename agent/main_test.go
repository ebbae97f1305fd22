package main

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestNoKubernetesClient pins that the agent talks to no Kubernetes API of the
// hub: none of its packages imports a Kubernetes client. (crossplane-runtime's
// errors package links client-go's rest package in transitively; it is never
// used to connect.)
//
// The one exemption is the kubevirt driver: its client talks to the *target
// KubeVirt cluster* the agent fronts, with the credentials the operator gives
// it (--kubevirt-kubeconfig), never to the hub's cluster. The agent still
// holds no credentials for the hub's cluster.
func TestNoKubernetesClient(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("the go command is not on PATH, so imports cannot be listed")
	}
	out, err := exec.Command(gobin, "list", "-f", `{{.ImportPath}}: {{join .Imports " "}}`, "github.com/virtfleet/virtfleet/agent/...").CombinedOutput() //nolint:gosec // fixed arguments
	require.NoError(t, err, "%s", out)
	exempt := map[string]bool{"github.com/virtfleet/virtfleet/agent/driver/kubevirt": true}
	forbidden := []string{"k8s.io/client-go/kubernetes", "k8s.io/client-go/rest", "k8s.io/client-go/tools/clientcmd", "k8s.io/client-go/dynamic", "sigs.k8s.io/controller-runtime/pkg/client", "sigs.k8s.io/controller-runtime/pkg/manager"}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, imports, _ := strings.Cut(line, ": ")
		if exempt[pkg] {
			continue
		}
		for _, imp := range strings.Fields(imports) {
			for _, f := range forbidden {
				assert.False(t, imp == f || strings.HasPrefix(imp, f+"/"), "%s imports %s", pkg, imp)
			}
		}
	}
}
