package benchmark

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// The real guest's section says what was measured, why nothing was, or what
// failed; a run without it has no such section.
func TestMarkdownShowsTheRealGuest(t *testing.T) {
	cases := map[string]struct {
		guest    *GuestBoot
		want     []string
		wantNone bool
	}{
		"measured": {
			guest: &GuestBoot{Hypervisor: "qemu", VCPU: 1, MemoryBytes: 1 << 30, ImageBytes: 426 << 20, BootTimes: BootTimes{ImportSeconds: 11.2, CreateToRunningSeconds: 3.4, CreateToAddressSeconds: 61.5, CreateToSSHSeconds: 80.25}},
			want:  []string{"## One real guest", "426 MiB", "`qemu`: TCG", "| create→Running | 3.4 s |", "| create→address | 61.5 s |", "| create→ssh | 80.2 s |"},
		},
		"no ssh": {
			guest: &GuestBoot{Hypervisor: "kvm", BootTimes: BootTimes{CreateToRunningSeconds: 3, CreateToAddressSeconds: 20}, Notes: []string{"no ssh to 10.0.0.2"}},
			want:  []string{"| create→ssh | – |", "- no ssh to 10.0.0.2"},
		},
		"skipped": {
			guest: &GuestBoot{Skipped: "a real hypervisor needs [qemu-system-x86_64]"},
			want:  []string{"Skipped: a real hypervisor needs [qemu-system-x86_64]."},
		},
		"not asked for": {wantNone: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			md := Markdown(&Result{Guest: tc.guest})
			if tc.wantNone {
				assert.NotContains(t, md, "real guest")
				return
			}
			for _, w := range tc.want {
				assert.Contains(t, md, w)
			}
		})
	}
}
