package driver

import (
	"testing"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/stretchr/testify/assert"
)

func TestErrorKinds(t *testing.T) {
	cases := map[string]struct {
		err      error
		notFound bool
		terminal bool
		failing  bool
		inUse    bool
	}{
		"NotFoundSurvivesWrapping": {err: errors.Wrap(NotFoundf("no guest"), "cannot observe"), notFound: true},
		"TerminalSurvivesWrapping": {err: errors.Wrap(Terminalf("network x has no cidr"), "cannot ensure"), terminal: true},
		"FailingSurvivesWrapping":  {err: errors.Wrap(Failingf("checksum mismatch"), "cannot ensure"), failing: true},
		"PlainErrorIsRetryable":    {err: errors.New("connection reset")},
		"NilStaysNil":              {err: Terminal(nil)},
		"NilStaysNilWhenFailing":   {err: Failing(nil)},
		"InUseSurvivesWrapping":    {err: errors.Wrap(InUsef("attached to guest a"), "cannot delete volume"), inUse: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			assert.Equal(t, tc.notFound, IsNotFound(tc.err))
			assert.Equal(t, tc.terminal, IsTerminal(tc.err))
			assert.Equal(t, tc.failing, IsFailing(tc.err))
			assert.Equal(t, tc.inUse, IsInUse(tc.err))
		})
	}
}

func TestMachineValidate(t *testing.T) {
	valid := Machine{UID: "6f1c9a52-7b0e-4d4b-9a43-2f7d0c1e5b11", Namespace: "ns", Name: "vm", VCPU: 1, MemoryBytes: 1 << 30, Disks: []Disk{{Name: "ns_root"}}}
	cases := map[string]struct {
		change func(*Machine)
		want   string
	}{
		"AValidMachinePasses": {change: func(*Machine) {}},
		"NoUID":               {change: func(m *Machine) { m.UID = "" }, want: "uid is required"},
		"NoVCPU":              {change: func(m *Machine) { m.VCPU = 0 }, want: "vcpu must be at least 1, got 0"},
		"NoMemory":            {change: func(m *Machine) { m.MemoryBytes = 0 }, want: "memory must be greater than 0, got 0 bytes"},
		"NegativeSwap":        {change: func(m *Machine) { m.SwapBytes = -1 }, want: "swap must not be negative, got -1 bytes"},
		"NoDisk":              {change: func(m *Machine) { m.Disks = nil }, want: "at least one disk is required to boot from"},
		"NoName":              {change: func(m *Machine) { m.Name = "" }, want: "namespace and name are required"},
		"UnknownFirmware":     {change: func(m *Machine) { m.Firmware = "coreboot" }, want: `firmware must be bios or uefi, got "coreboot"`},
		"UnnamedDisk":         {change: func(m *Machine) { m.Disks = append(m.Disks, Disk{}) }, want: "every disk needs a name"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			m := valid
			m.Disks = append([]Disk(nil), valid.Disks...)
			tc.change(&m)
			err := m.Validate()
			if tc.want == "" {
				assert.NoError(t, err)
				return
			}
			assert.EqualError(t, err, tc.want)
			assert.True(t, IsTerminal(err), "bad input is terminal")
		})
	}
}

func TestReachableLeavesOutAddressesNobodyReachesTheGuestAt(t *testing.T) {
	cases := map[string]struct {
		ips  []string
		want []string
	}{
		"IPv4AndGlobalIPv6Stay":      {ips: []string{"10.0.0.5", "2001:db8::5"}, want: []string{"10.0.0.5", "2001:db8::5"}},
		"IPv6LinkLocalGoes":          {ips: []string{"fe80::5054:ff:fec4:9e2d", "10.0.0.5"}, want: []string{"10.0.0.5"}},
		"IPv6LinkLocalWithAZoneGoes": {ips: []string{"fe80::1%eth0"}},
		"IPv4LinkLocalGoes":          {ips: []string{"169.254.3.4"}},
		"LoopbackGoes":               {ips: []string{"127.0.0.1", "::1"}},
		"UnparsableGoes":             {ips: []string{"10.0.0.5/24", ""}},
		"NoneIsNone":                 {},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			assert.Equal(t, tc.want, Reachable(tc.ips))
		})
	}
}
