package driver_test

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/virtfleet/virtfleet/agent/driver"
)

func TestHostAddresses(t *testing.T) {
	for cidr, want := range map[string][3]string{ // gateway, last host, broadcast
		"10.10.120.0/24": {"10.10.120.1", "10.10.120.254", "10.10.120.255"},
		"10.10.120.7/24": {"10.10.120.1", "10.10.120.254", "10.10.120.255"},
		"10.20.0.0/16":   {"10.20.0.1", "10.20.255.254", "10.20.255.255"},
		"192.0.2.0/30":   {"192.0.2.1", "192.0.2.2", "192.0.2.3"},
	} {
		p := netip.MustParsePrefix(cidr)
		n := driver.HostCount(p)
		assert.Equal(t, want, [3]string{driver.Gateway(p).String(), driver.HostAddr(p, n).String(), driver.HostAddr(p, n+1).String()}, cidr)
	}
}

func TestSubnet(t *testing.T) {
	addr := netip.MustParsePrefix
	for name, tc := range map[string]struct {
		n       driver.Network
		want    string
		wantErr string
	}{
		"TheCIDR":                {n: driver.Network{Name: "n", CIDR: "10.10.120.7/24"}, want: "10.10.120.0/24"},
		"AnAddressInIt":          {n: driver.Network{Name: "n", CIDR: "10.10.120.0/24", Address: addr("10.10.120.5/24")}, want: "10.10.120.0/24"},
		"TheAddressesOwnPrefix":  {n: driver.Network{Name: "n", Address: addr("10.10.120.5/24")}, want: "10.10.120.0/24"},
		"NoCIDRNorAddress":       {n: driver.Network{Name: "n"}, wantErr: "has no cidr"},
		"ACIDRThatIsNoSubnet":    {n: driver.Network{Name: "n", CIDR: "10.10.120.0"}, wantErr: "not an IPv4 subnet"},
		"AnIPv6CIDR":             {n: driver.Network{Name: "n", CIDR: "fd00::/64"}, wantErr: "not an IPv4 subnet"},
		"ASubnetWithoutRoom":     {n: driver.Network{Name: "n", CIDR: "10.10.120.0/31"}, wantErr: "at least 4 addresses"},
		"AnIPv6Address":          {n: driver.Network{Name: "n", CIDR: "10.10.120.0/24", Address: addr("fd00::5/64")}, wantErr: "not IPv4"},
		"AnAddressOutside":       {n: driver.Network{Name: "n", CIDR: "10.10.120.0/24", Address: addr("10.10.121.5/24")}, wantErr: "not in its subnet 10.10.120.0/24"},
		"AnAddressOfOtherLength": {n: driver.Network{Name: "n", CIDR: "10.10.120.0/24", Address: addr("10.10.120.5/16")}, wantErr: "prefix length"},
		"TheNetworksAddress":     {n: driver.Network{Name: "n", CIDR: "10.10.120.0/24", Address: addr("10.10.120.0/24")}, wantErr: "network or broadcast"},
		"TheBroadcastAddress":    {n: driver.Network{Name: "n", CIDR: "10.10.120.0/24", Address: addr("10.10.120.255/24")}, wantErr: "network or broadcast"},
		"TheGatewaysAddress":     {n: driver.Network{Name: "n", CIDR: "10.10.120.0/24", Address: addr("10.10.120.1/24")}, wantErr: "the gateway's"},
		"TheLastHostIsAGuests":   {n: driver.Network{Name: "n", CIDR: "10.10.120.0/24", Address: addr("10.10.120.254/24")}, want: "10.10.120.0/24"},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := tc.n.Subnet()
			if tc.wantErr != "" {
				require.Error(t, err)
				assert.True(t, driver.IsTerminal(err), "%v", err)
				assert.Contains(t, err.Error(), tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got.String())
		})
	}
}
