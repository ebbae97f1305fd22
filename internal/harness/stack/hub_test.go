package stack

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestHubEnv(t *testing.T) {
	cases := map[string]struct {
		opts Options
		want []string
	}{
		"NoLimit":   {want: []string{"KUBECONFIG=/k"}},
		"WithLimit": {opts: Options{HubMemoryLimit: 2 << 30}, want: []string{"KUBECONFIG=/k", "VIRTFLEET_MEMORY_LIMIT=2147483648"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			s := &Stack{opts: tc.opts, hubKubeconfig: "/k"}
			assert.Equal(t, tc.want, s.hubEnv())
		})
	}
}
