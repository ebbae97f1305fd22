package nova

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestLastHost(t *testing.T) {
	for cidr, want := range map[string]string{
		"10.10.120.0/24": "10.10.120.254",
		"10.10.120.7/24": "10.10.120.254",
		"10.20.0.0/16":   "10.20.255.254",
		"192.0.2.0/30":   "192.0.2.2",
	} {
		assert.Equal(t, want, lastHost(netip.MustParsePrefix(cidr)).String(), cidr)
	}
}
