package driver

import (
	"context"
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
	}{
		"NotFoundSurvivesWrapping": {err: errors.Wrap(NotFoundf("no guest"), "cannot observe"), notFound: true},
		"TerminalSurvivesWrapping": {err: errors.Wrap(Terminalf("network x has no cidr"), "cannot ensure"), terminal: true},
		"FailingSurvivesWrapping":  {err: errors.Wrap(Failingf("checksum mismatch"), "cannot ensure"), failing: true},
		"PlainErrorIsRetryable":    {err: errors.New("connection reset")},
		"NilStaysNil":              {err: Terminal(nil)},
		"NilStaysNilWhenFailing":   {err: Failing(nil)},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			assert.Equal(t, tc.notFound, IsNotFound(tc.err))
			assert.Equal(t, tc.terminal, IsTerminal(tc.err))
			assert.Equal(t, tc.failing, IsFailing(tc.err))
		})
	}
}

func TestRegistry(t *testing.T) {
	built := errors.New("built")
	r := Registry{BackendLibvirt: func(context.Context, Config) (Driver, error) { return nil, built }}
	cases := map[string]struct {
		backend string
		want    string
	}{
		"RegisteredBackendIsBuilt":   {backend: BackendLibvirt, want: "built"},
		"UnknownBackendListsChoices": {backend: "xen", want: `unknown backend "xen"; want one of libvirt, nova, kubevirt`},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := r.New(context.Background(), Config{Backend: tc.backend})
			assert.EqualError(t, err, tc.want)
		})
	}
}
