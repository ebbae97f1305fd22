package main

import (
	"flag"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestEnvFallback(t *testing.T) {
	cases := []struct {
		name    string
		args    []string
		env     map[string]string
		node    string
		every   time.Duration
		wantErr string
	}{
		{name: "DefaultsWithoutEnvOrFlags", node: "", every: 2 * time.Second},
		{name: "EnvFillsAnUnsetFlag", env: map[string]string{"VIRTFLEET_NODE": "n1", "VIRTFLEET_HEARTBEAT_INTERVAL": "5s"}, node: "n1", every: 5 * time.Second},
		{name: "TheCommandLineWinsOverEnv", args: []string{"--node=n2"}, env: map[string]string{"VIRTFLEET_NODE": "n1"}, node: "n2", every: 2 * time.Second},
		{name: "AMalformedEnvValueIsAnError", env: map[string]string{"VIRTFLEET_HEARTBEAT_INTERVAL": "often"}, wantErr: "VIRTFLEET_HEARTBEAT_INTERVAL"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fs := flag.NewFlagSet("agent", flag.ContinueOnError)
			node := fs.String("node", "", "")
			every := fs.Duration("heartbeat-interval", 2*time.Second, "")
			require.NoError(t, fs.Parse(tc.args))
			err := envFallback(fs, func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok })
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.node, *node)
			assert.Equal(t, tc.every, *every)
		})
	}
}

func TestHelpNamesTheEnvironmentVariable(t *testing.T) {
	fs := flag.NewFlagSet("agent", flag.ContinueOnError)
	fs.String("nats-url", "", "NATS servers.")
	documentEnv(fs)
	assert.Equal(t, "NATS servers. (env VIRTFLEET_NATS_URL)", fs.Lookup("nats-url").Usage)
}

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
