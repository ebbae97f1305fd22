package nova

import (
	"testing"

	"github.com/gophercloud/gophercloud/v2/openstack/blockstorage/v3/volumes"
	"github.com/stretchr/testify/assert"
)

func TestFrozenOnlyWhereNovaMustQuiesce(t *testing.T) {
	cases := map[string]struct {
		meta map[string]string
		want bool
	}{
		"AgentAndQuiesceRequired":      {meta: map[string]string{"hw_qemu_guest_agent": "yes", "os_require_quiesce": "yes"}, want: true},
		"AsOsloSpellsTrue":             {meta: map[string]string{"hw_qemu_guest_agent": "True", "os_require_quiesce": "1"}, want: true},
		"AgentWithoutRequireIsSkipped": {meta: map[string]string{"hw_qemu_guest_agent": "yes"}},
		"RequireWithoutAgent":          {meta: map[string]string{"os_require_quiesce": "yes"}},
		"AgentOff":                     {meta: map[string]string{"hw_qemu_guest_agent": "no", "os_require_quiesce": "yes"}},
		"NoImageMetadata":              {},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			assert.Equal(t, tc.want, quiesceRequired(tc.meta))
		})
	}
}

func TestRestartsSurviveOnlyTheirOwnGuestsRevert(t *testing.T) {
	cases := map[string]struct {
		meta map[string]string
		want string
	}{
		"RevertedThisGuest":   {meta: map[string]string{metaRevertedUID: "u1", MetaRestarts: "3"}, want: "3"},
		"AnotherGuestsVolume": {meta: map[string]string{metaRevertedUID: "u2", MetaRestarts: "3"}, want: "0"},
		"NeverReverted":       {want: "0"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			assert.Equal(t, tc.want, restartsAfterRevert(&volumes.Volume{Metadata: tc.meta}, "u1"))
		})
	}
}
