package libvirt

import (
	"testing"
	"time"

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
