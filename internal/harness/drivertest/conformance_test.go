package drivertest

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestCasesAreNamedOnceAndNeedKnownCapabilities: a backend's declaration
// can only skip a case through a capability the suite knows, and a
// subtest name picks out one case.
func TestCasesAreNamedOnceAndNeedKnownCapabilities(t *testing.T) {
	seen := map[string]bool{}
	used := map[Capability]bool{}
	for _, tc := range cases {
		assert.False(t, seen[tc.name], "case %s is named twice", tc.name)
		seen[tc.name] = true
		for _, need := range tc.needs {
			assert.Contains(t, capabilities, need, "case %s", tc.name)
			used[need] = true
		}
	}
	for _, c := range capabilities {
		assert.True(t, used[c], "capability %s is needed by no case: declaring it would skip nothing", c)
	}
}
