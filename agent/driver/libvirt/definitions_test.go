package libvirt

import (
	"context"
	"testing"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"libvirt.org/go/libvirtxml"

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
			change: func(t *testing.T, l *golibvirt.Libvirt, dom golibvirt.Domain) {
				x, err := l.DomainGetXMLDesc(dom, golibvirt.DomainXMLInactive)
				require.NoError(t, err)
				var def libvirtxml.Domain
				require.NoError(t, def.Unmarshal(x))
				def.VCPU.Value = 6
				x, err = def.Marshal()
				require.NoError(t, err)
				_, err = l.DomainDefineXMLFlags(x, 0)
				require.NoError(t, err)
			},
			want: 6,
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
