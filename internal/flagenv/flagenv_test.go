package flagenv

import (
	"flag"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParse(t *testing.T) {
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
		{name: "AnAlsoVariableFillsAnUnsetFlag", env: map[string]string{"POD_NAMESPACE": "n3"}, node: "n3", every: 2 * time.Second},
		{name: "TheFlagsOwnVariableWinsOverAnAlso", env: map[string]string{"POD_NAMESPACE": "n3", "VIRTFLEET_NODE": "n1"}, node: "n1", every: 2 * time.Second},
		{name: "AMalformedFlagIsAnError", args: []string{"--heartbeat-interval=often"}, wantErr: "heartbeat-interval"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fs := flag.NewFlagSet("agent", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			node := fs.String("node", "", "")
			every := fs.Duration("heartbeat-interval", 2*time.Second, "")
			err := Parse(fs, tc.args, func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok }, map[string][]string{"node": {"POD_NAMESPACE"}})
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

func TestHelpNamesTheEnvironmentVariables(t *testing.T) {
	fs := flag.NewFlagSet("hub", flag.ContinueOnError)
	fs.String("nats-url", "", "NATS servers.")
	fs.String("leader-election-namespace", "", "Lease namespace.")
	require.NoError(t, Parse(fs, nil, func(string) (string, bool) { return "", false }, map[string][]string{"leader-election-namespace": {"POD_NAMESPACE"}}))
	assert.Equal(t, "NATS servers. (env VIRTFLEET_NATS_URL)", fs.Lookup("nats-url").Usage)
	assert.Equal(t, "Lease namespace. (env VIRTFLEET_LEADER_ELECTION_NAMESPACE, POD_NAMESPACE)", fs.Lookup("leader-election-namespace").Usage)
}
