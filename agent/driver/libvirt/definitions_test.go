package libvirt

import (
	"context"
	"testing"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"libvirt.org/go/libvirtxml"

	"github.com/virtfleet/virtfleet/agent/driver"
	"github.com/virtfleet/virtfleet/internal/harness/libvirttest"
)

// TestCapacityFollowsChangesBehindTheDriversBack: Capacity keeps the
// domains' definitions between heartbeats; a change made with virsh (here a
// plain go-libvirt connection) shows in the next heartbeats all the same.
func TestCapacityFollowsChangesBehindTheDriversBack(t *testing.T) {
	cases := map[string]struct {
		change func(t *testing.T, l *golibvirt.Libvirt, dom golibvirt.Domain)
		// want is the guest's vCPUs counted after the change.
		want int64
	}{
		"ItsDefinitionChanges": {
			change: func(t *testing.T, l *golibvirt.Libvirt, dom golibvirt.Domain) { redefineVCPU(t, l, dom, 6) },
			want:   6,
		},
		"ItsMetadataIsRemoved": {
			change: func(t *testing.T, l *golibvirt.Libvirt, dom golibvirt.Domain) {
				require.NoError(t, l.DomainSetMetadata(dom, int32(golibvirt.DomainMetadataElement), golibvirt.OptString{}, golibvirt.OptString{}, golibvirt.OptString{Namespace}, golibvirt.DomainAffectConfig))
			},
			want: 0,
		},
		"ItIsUndefined": {
			change: func(t *testing.T, l *golibvirt.Libvirt, dom golibvirt.Domain) {
				require.NoError(t, l.DomainUndefine(dom))
			},
			want: 0,
		},
	}
	ctx := context.Background()
	node := libvirttest.Start(t, "capacity")
	d := open(t, node)
	l := raw(t, node)
	other := machine("other")
	_, err := d.Ensure(ctx, other)
	require.NoError(t, err)
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			m := machine(name)
			m.Running = false
			_, err := d.Ensure(ctx, m)
			require.NoError(t, err)
			c, err := d.Capacity(ctx)
			require.NoError(t, err)
			require.Equal(t, int64(other.VCPU+m.VCPU), c.AllocatedVCPU, "read once, so the change is made to a definition already known")

			dom := domainOf(t, l, m.UID)
			tc.change(t, l, dom)
			assert.EventuallyWithT(t, func(c *assert.CollectT) {
				got, err := d.Capacity(ctx)
				require.NoError(c, err)
				assert.Equal(c, int64(other.VCPU)+tc.want, got.AllocatedVCPU)
			}, 5*time.Second, 20*time.Millisecond)
			_ = d.Delete(ctx, m.UID)
		})
	}
}

// redefineVCPU redefines dom behind the driver's back with vcpu vCPUs.
func redefineVCPU(t *testing.T, l *golibvirt.Libvirt, dom golibvirt.Domain, vcpu uint) {
	t.Helper()
	x, err := l.DomainGetXMLDesc(dom, golibvirt.DomainXMLInactive)
	require.NoError(t, err)
	var def libvirtxml.Domain
	require.NoError(t, def.Unmarshal(x))
	def.VCPU.Value, def.VCPU.Current = vcpu, vcpu
	x, err = def.Marshal()
	require.NoError(t, err)
	_, err = l.DomainDefineXMLFlags(x, 0)
	require.NoError(t, err)
}

// TestListFollowsChangesBehindTheDriversBack: List keeps the domains'
// definitions between resyncs and reads their states in one call; a change
// made with virsh (here a plain go-libvirt connection) shows in the next
// lists all the same.
func TestListFollowsChangesBehindTheDriversBack(t *testing.T) {
	cases := map[string]struct {
		running bool
		change  func(t *testing.T, l *golibvirt.Libvirt, dom golibvirt.Domain)
		// want is what List says of the guest after the change; nil when
		// it lists it no more.
		want func(t assert.TestingT, o *driver.Observation)
	}{
		"ItIsForcedOff": {
			running: true,
			change: func(t *testing.T, l *golibvirt.Libvirt, dom golibvirt.Domain) {
				require.NoError(t, l.DomainDestroy(dom))
			},
			want: func(t assert.TestingT, o *driver.Observation) {
				if assert.NotNil(t, o) {
					assert.Equal(t, driver.PhaseStopped, o.Phase)
				}
			},
		},
		"ItsDefinitionChanges": {
			change: func(t *testing.T, l *golibvirt.Libvirt, dom golibvirt.Domain) { redefineVCPU(t, l, dom, 6) },
			want: func(t assert.TestingT, o *driver.Observation) {
				if assert.NotNil(t, o) {
					assert.Equal(t, int32(6), o.VCPU)
				}
			},
		},
		"ItsMetadataIsRemoved": {
			change: func(t *testing.T, l *golibvirt.Libvirt, dom golibvirt.Domain) {
				require.NoError(t, l.DomainSetMetadata(dom, int32(golibvirt.DomainMetadataElement), golibvirt.OptString{}, golibvirt.OptString{}, golibvirt.OptString{Namespace}, golibvirt.DomainAffectConfig))
			},
			want: func(t assert.TestingT, o *driver.Observation) { assert.Nil(t, o) },
		},
		"ItIsUndefined": {
			change: func(t *testing.T, l *golibvirt.Libvirt, dom golibvirt.Domain) {
				require.NoError(t, l.DomainUndefine(dom))
			},
			want: func(t assert.TestingT, o *driver.Observation) { assert.Nil(t, o) },
		},
	}
	ctx := context.Background()
	node := libvirttest.Start(t, "list")
	d := open(t, node)
	l := raw(t, node)
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			m := machine(name)
			m.Running = tc.running
			_, err := d.Ensure(ctx, m)
			require.NoError(t, err)
			find := func(t require.TestingT) *driver.Observation {
				all, err := d.List(ctx)
				require.NoError(t, err)
				for _, o := range all {
					if o.UID == m.UID {
						return &o
					}
				}
				return nil
			}
			require.NotNil(t, find(t), "listed once, so the change is made to a definition already known")

			tc.change(t, l, domainOf(t, l, m.UID))
			assert.EventuallyWithT(t, func(c *assert.CollectT) { tc.want(c, find(c)) }, 5*time.Second, 20*time.Millisecond)
			_ = d.Delete(ctx, m.UID)
		})
	}
}

// TestDefinitionsAreKeptForAWhileOnly: a definition, and the list of the
// domains, is read again once definitionsMaxAge passed, even when no event
// said it changed; the list also after any domain was dropped.
func TestDefinitionsAreKeptForAWhileOnly(t *testing.T) {
	dom := golibvirt.Domain{Name: "a", UUID: mustUUID(t, "0b5e3f1a-7c2d-4e8f-9a1b-000000000001")}
	cases := map[string]struct {
		// after happens between the first read and the second, which is
		// made at the time it returns.
		after     func(defs *definitions) time.Duration
		wantReads int
	}{
		"KeptWhileNothingChanged": {after: func(*definitions) time.Duration { return definitionsMaxAge - time.Second }, wantReads: 1},
		"ReadAgainOnceTooOld":     {after: func(*definitions) time.Duration { return definitionsMaxAge }, wantReads: 2},
		"ReadAgainOnceDropped": {after: func(defs *definitions) time.Duration {
			defs.forget(formatUUID(dom.UUID))
			return 0
		}, wantReads: 2},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			now := time.Unix(1_800_000_000, 0)
			defs := newDefinitions()
			defs.now = func() time.Time { return now }
			api := &countingAPI{dom: dom}
			_, err := defs.read(api, 1, dom)
			require.NoError(t, err)
			_, err = defs.domains(api, 1)
			require.NoError(t, err)
			now = now.Add(tc.after(defs))
			_, err = defs.read(api, 1, dom)
			require.NoError(t, err)
			_, err = defs.domains(api, 1)
			require.NoError(t, err)
			assert.Equal(t, tc.wantReads, api.xmlReads, "definitions read")
			assert.Equal(t, tc.wantReads, api.lists, "lists of the domains")
		})
	}
}

// countingAPI answers DomainGetXMLDesc and ConnectListAllDomains about one
// domain, counting them.
type countingAPI struct {
	API
	dom             golibvirt.Domain
	xmlReads, lists int
}

func (a *countingAPI) DomainGetXMLDesc(golibvirt.Domain, golibvirt.DomainXMLFlags) (string, error) {
	a.xmlReads++
	return (&libvirtxml.Domain{Type: "test", Name: a.dom.Name, VCPU: &libvirtxml.DomainVCPU{Value: 1}}).Marshal()
}

func (a *countingAPI) ConnectListAllDomains(int32, golibvirt.ConnectListAllDomainsFlags) ([]golibvirt.Domain, uint32, error) {
	a.lists++
	return []golibvirt.Domain{a.dom}, 1, nil
}

// TestAReadOverlappingAChangeIsNotKept: a definition read before a change
// but returned after it must not stand for the changed domain.
func TestAReadOverlappingAChangeIsNotKept(t *testing.T) {
	defs := newDefinitions()
	dom := golibvirt.Domain{Name: "a", UUID: mustUUID(t, "0b5e3f1a-7c2d-4e8f-9a1b-000000000001")}
	key := formatUUID(dom.UUID)
	reads := 0
	api := xmlAPI{xml: func() (string, error) {
		reads++
		if reads == 1 {
			defs.forget(key) // the change's event arrives while the read runs
		}
		return (&libvirtxml.Domain{Type: "test", Name: "a", VCPU: &libvirtxml.DomainVCPU{Value: uint(reads)}}).Marshal()
	}}

	first, err := defs.read(api, 1, dom)
	require.NoError(t, err)
	assert.Equal(t, int64(1), first.vcpu)
	second, err := defs.read(api, 1, dom)
	require.NoError(t, err)
	assert.Equal(t, int64(2), second.vcpu, "the first read was not kept")
	third, err := defs.read(api, 1, dom)
	require.NoError(t, err)
	assert.Equal(t, int64(2), third.vcpu, "the second was")
	fourth, err := defs.read(api, 2, dom)
	require.NoError(t, err)
	assert.Equal(t, int64(3), fourth.vcpu, "nothing read on an earlier connection is kept")
	assert.Equal(t, 3, reads)
}

// xmlAPI answers DomainGetXMLDesc, and only that.
type xmlAPI struct {
	API
	xml func() (string, error)
}

func (a xmlAPI) DomainGetXMLDesc(golibvirt.Domain, golibvirt.DomainXMLFlags) (string, error) {
	return a.xml()
}
