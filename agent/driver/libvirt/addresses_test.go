package libvirt

import (
	"testing"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"
	"github.com/stretchr/testify/assert"

	"github.com/virtfleet/virtfleet/agent/driver"
)

func TestAddressBook(t *testing.T) {
	t0 := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	t1 := t0.Add(time.Minute)
	db := nic{network: "net-db", mac: "52:54:00:00:00:01"}
	be := nic{network: "net-backend", mac: "52:54:00:00:00:02"}
	lease := func(ips ...string) sighting { return sighting{ips: ips, source: driver.AddressSourceLease} }
	arp := func(ips ...string) sighting { return sighting{ips: ips, source: driver.AddressSourceARP} }

	type look struct {
		nics []nic
		seen map[string]sighting
		at   time.Time
	}
	cases := map[string]struct {
		looks []look
		want  []driver.Interface
	}{
		"FirstSightingIsReportedWithSourceAndTime": {
			looks: []look{{nics: []nic{db}, seen: map[string]sighting{db.mac: lease("10.10.120.21")}, at: t0}},
			want:  []driver.Interface{{Network: "net-db", MAC: db.mac, IPs: []string{"10.10.120.21"}, Source: driver.AddressSourceLease, LastSeen: t0}},
		},
		"AnEmptyLookKeepsTheLastAddress": {
			looks: []look{
				{nics: []nic{db}, seen: map[string]sighting{db.mac: lease("10.10.120.21")}, at: t0},
				{nics: []nic{db}, seen: map[string]sighting{}, at: t1},
			},
			want: []driver.Interface{{Network: "net-db", MAC: db.mac, IPs: []string{"10.10.120.21"}, Source: driver.AddressSourceLease, LastSeen: t0}},
		},
		"ADifferentAddressFromAnySourceReplacesTheOld": {
			looks: []look{
				{nics: []nic{db}, seen: map[string]sighting{db.mac: lease("10.10.120.21")}, at: t0},
				{nics: []nic{db}, seen: map[string]sighting{db.mac: arp("10.10.120.99")}, at: t1},
			},
			want: []driver.Interface{{Network: "net-db", MAC: db.mac, IPs: []string{"10.10.120.99"}, Source: driver.AddressSourceARP, LastSeen: t1}},
		},
		"AnInterfaceThatWentAwayIsDropped": {
			looks: []look{
				{nics: []nic{db, be}, seen: map[string]sighting{db.mac: lease("10.10.120.21"), be.mac: lease("10.10.150.12")}, at: t0},
				{nics: []nic{be}, seen: map[string]sighting{}, at: t1},
			},
			want: []driver.Interface{{Network: "net-backend", MAC: be.mac, IPs: []string{"10.10.150.12"}, Source: driver.AddressSourceLease, LastSeen: t0}},
		},
		"AnInterfaceNeverSeenHasNoAddress": {
			looks: []look{{nics: []nic{db}, seen: nil, at: t0}},
			want:  []driver.Interface{{Network: "net-db", MAC: db.mac}},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			b := newAddressBook()
			var got []driver.Interface
			for _, l := range tc.looks {
				got = b.merge("uid", l.nics, l.seen, l.at)
			}
			assert.Equal(t, tc.want, got)
		})
	}

	t.Run("ForgetClearsAGuest", func(t *testing.T) {
		b := newAddressBook()
		b.merge("uid", []nic{db}, map[string]sighting{db.mac: lease("10.10.120.21")}, t0)
		b.forget("uid")
		assert.Equal(t, []driver.Interface{{Network: "net-db", MAC: db.mac}}, b.merge("uid", []nic{db}, nil, t1))
	})
}

// leaseAPI serves one network's DHCP leases; any other call panics.
type leaseAPI struct {
	API
	networkXML string
	leases     []golibvirt.NetworkDhcpLease
}

func (a leaseAPI) NetworkLookupByName(name string) (golibvirt.Network, error) {
	return golibvirt.Network{Name: name}, nil
}

func (a leaseAPI) NetworkGetXMLDesc(golibvirt.Network, uint32) (string, error) {
	return a.networkXML, nil
}

func (a leaseAPI) NetworkGetDhcpLeases(golibvirt.Network, golibvirt.OptString, int32, uint32) ([]golibvirt.NetworkDhcpLease, uint32, error) {
	return a.leases, uint32(len(a.leases)), nil
}

func TestStaleLeasesAreThoseOfAnEarlierBoot(t *testing.T) {
	started := time.Unix(1_800_000_000, 0)
	lease := func(mac string, grantedAfterStart, leaseTime time.Duration) golibvirt.NetworkDhcpLease {
		return golibvirt.NetworkDhcpLease{Mac: golibvirt.OptString{mac}, Ipaddr: "192.168.122.9", Expirytime: started.Add(grantedAfterStart + leaseTime).Unix()}
	}
	const a, b = "52:54:00:00:00:0a", "52:54:00:00:00:0b"
	nics := []nic{{network: "default", mac: a}, {network: "default", mac: b}}
	cases := map[string]struct {
		networkXML string
		leases     []golibvirt.NetworkDhcpLease
		want       map[string]bool
	}{
		"LeaseFromBeforeTheStartIsStale": {
			leases: []golibvirt.NetworkDhcpLease{lease(a, -10*time.Minute, time.Hour)},
			want:   map[string]bool{a: true},
		},
		"LeaseGrantedAfterTheStartIsThisBoots": {
			leases: []golibvirt.NetworkDhcpLease{lease(a, 40*time.Second, time.Hour)},
			want:   map[string]bool{},
		},
		"LeaseGrantedInTheSecondOfTheStartCounts": {
			leases: []golibvirt.NetworkDhcpLease{lease(a, 0, time.Hour)},
			want:   map[string]bool{},
		},
		"AFreshLeaseWinsOverAnOldOne": {
			leases: []golibvirt.NetworkDhcpLease{lease(a, -time.Minute, time.Hour), lease(a, time.Minute, time.Hour)},
			want:   map[string]bool{},
		},
		"TheNetworksOwnLeaseTimeIsUsed": {
			networkXML: `<network><name>default</name><ip address="192.168.122.1"><dhcp><range start="192.168.122.2" end="192.168.122.254"><lease expiry="10" unit="minutes"/></range></dhcp></ip></network>`,
			// With a one-hour assumption this lease would look granted 50 minutes before the start.
			leases: []golibvirt.NetworkDhcpLease{lease(b, time.Second, 10*time.Minute)},
			want:   map[string]bool{},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			x := tc.networkXML
			if x == "" {
				x = `<network><name>default</name></network>`
			}
			got := staleLeases(newNetworkView(leaseAPI{networkXML: x, leases: tc.leases}), nics, started)
			assert.Equal(t, tc.want, got)
		})
	}
}
