package libvirt

import (
	"testing"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"
	"github.com/stretchr/testify/assert"
)

func TestEchoes(t *testing.T) {
	const key = "0b5e3f1a-7c2d-4e8f-9a1b-000000000001"
	t0 := time.Date(2026, 11, 25, 7, 0, 0, 0, time.UTC)
	started := golibvirt.DomainEventStarted
	type heard struct {
		key   string
		event golibvirt.DomainEventType
		at    time.Time
		echo  bool
	}
	cases := map[string]struct {
		prepare func(e *echoes)
		heard   []heard
	}{
		"AnExpectedEventIsAnEchoOnce": {
			prepare: func(e *echoes) { e.expect(key, started, t0) },
			heard:   []heard{{key, started, t0, true}, {key, started, t0, false}},
		},
		"NothingExpectedIsNoEcho": {
			heard: []heard{{key, started, t0, false}},
		},
		"AnotherKindOrDomainIsNoEcho": {
			prepare: func(e *echoes) { e.expect(key, started, t0) },
			heard: []heard{
				{key, golibvirt.DomainEventStopped, t0, false},
				{"0b5e3f1a-7c2d-4e8f-9a1b-000000000002", started, t0, false},
				{key, started, t0, true},
			},
		},
		"AWithdrawnExpectationIsNoEcho": {
			prepare: func(e *echoes) { e.expect(key, started, t0); e.withdraw(key, started) },
			heard:   []heard{{key, started, t0, false}},
		},
		"AnExpectationLapses": {
			prepare: func(e *echoes) { e.expect(key, started, t0) },
			heard:   []heard{{key, started, t0.Add(echoTTL + time.Second), false}},
		},
		"ANewConnectionExpectsNothing": {
			prepare: func(e *echoes) { e.expect(key, started, t0); e.reset() },
			heard:   []heard{{key, started, t0, false}},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			e := newEchoes()
			if tc.prepare != nil {
				tc.prepare(e)
			}
			for i, h := range tc.heard {
				assert.Equal(t, h.echo, e.heard(h.key, h.event, h.at), "event %d", i)
			}
		})
	}
}
