package v1alpha1

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func exampleConsoleOpen() ConsoleOpen {
	return ConsoleOpen{ProtocolVersion: ProtocolVersion, Session: "3kT9vQ2mX8", UID: "6f1c2d9e-0b7a", Kind: ConsoleVNC}
}

func TestDecodeConsoleOpen(t *testing.T) {
	// errKind says which error type a case must yield: each is checked
	// with its own target, as errors.As into an interface matches any error.
	type errKind int
	const (
		none errKind = iota
		versionErr
		decodeErr
		keyErr
	)
	serial := exampleConsoleOpen()
	serial.Kind = ConsoleSerial
	cases := map[string]struct {
		in      []byte
		want    ConsoleOpen
		wantErr errKind
	}{
		"RoundTripsAVNCOpen":             {in: mustJSON(t, exampleConsoleOpen()), want: exampleConsoleOpen()},
		"RoundTripsASerialOpen":          {in: mustJSON(t, serial), want: serial},
		"IgnoresFieldsFromTheFuture":     {in: withField(t, exampleConsoleOpen(), "cols", 80), want: exampleConsoleOpen()},
		"RefusesANewerProtocolVersion":   {in: withField(t, exampleConsoleOpen(), "protocolVersion", ProtocolVersion+1), wantErr: versionErr},
		"RefusesAMissingProtocolVersion": {in: []byte(`{"session":"s","uid":"u","kind":"vnc"}`), wantErr: versionErr},
		"RefusesMalformedJSON":           {in: []byte(`{"protocolVersion":1,`), wantErr: decodeErr},
		"RefusesAnUnknownKind":           {in: withField(t, exampleConsoleOpen(), "kind", "spice"), wantErr: decodeErr},
		"RefusesAMissingKind":            {in: withField(t, exampleConsoleOpen(), "kind", ""), wantErr: decodeErr},
		"RefusesASessionWithADot":        {in: withField(t, exampleConsoleOpen(), "session", "a.b"), wantErr: keyErr},
		"RefusesAWildcardSession":        {in: withField(t, exampleConsoleOpen(), "session", ">"), wantErr: keyErr},
		"RefusesAnEmptySession":          {in: withField(t, exampleConsoleOpen(), "session", ""), wantErr: keyErr},
		"RefusesAUIDThatIsNotAKeyToken":  {in: withField(t, exampleConsoleOpen(), "uid", "a b"), wantErr: keyErr},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := DecodeConsoleOpen(tc.in)
			var (
				ve *VersionError
				de *DecodeError
				ke *KeyError
			)
			switch tc.wantErr {
			case none:
				require.NoError(t, err)
				assert.Equal(t, tc.want, got)
			case versionErr:
				require.ErrorAs(t, err, &ve)
			case decodeErr:
				require.ErrorAs(t, err, &de)
			case keyErr:
				require.ErrorAs(t, err, &ke)
			}
		})
	}
}

func TestEncodeConsoleOpenStampsTheVersionAndValidates(t *testing.T) {
	o := exampleConsoleOpen()
	o.ProtocolVersion = 0
	b, err := EncodeConsoleOpen(o)
	require.NoError(t, err)
	got, err := DecodeConsoleOpen(b)
	require.NoError(t, err)
	assert.Equal(t, exampleConsoleOpen(), got)

	o.Kind = "rdp"
	_, err = EncodeConsoleOpen(o)
	var de *DecodeError
	require.ErrorAs(t, err, &de, "an open of an unknown kind is never sent")
}

func TestConsoleSubjects(t *testing.T) {
	type subjects struct{ open, in, out string }
	cases := map[string]struct {
		node, session string
		want          subjects
		wantErr       bool
	}{
		"JoinsNodeAndSession": {node: "node1", session: "s1", want: subjects{
			open: "virtfleet.console.node1.open", in: "virtfleet.console.node1.s1.in", out: "virtfleet.console.node1.s1.out",
		}},
		"ADottedNodeNameIsOneToken": {node: "node-1.rack-a", session: "s1", want: subjects{
			open: "virtfleet.console.node-1_rack-a.open", in: "virtfleet.console.node-1_rack-a.s1.in", out: "virtfleet.console.node-1_rack-a.s1.out",
		}},
		"ASessionCalledOpenIsNoOpenSubject": {node: "node1", session: "open", want: subjects{
			open: "virtfleet.console.node1.open", in: "virtfleet.console.node1.open.in", out: "virtfleet.console.node1.open.out",
		}},
		"RefusesAnEmptyNode":             {node: "", session: "s1", wantErr: true},
		"RefusesASessionWithADot":        {node: "node1", session: "s1.x", wantErr: true},
		"RefusesAWildcardSession":        {node: "node1", session: "*", wantErr: true},
		"RefusesAFullWildcardSession":    {node: "node1", session: ">", wantErr: true},
		"RefusesAnEmptySession":          {node: "node1", session: "", wantErr: true},
		"RefusesASessionWithAWhitespace": {node: "node1", session: "s 1", wantErr: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			open, openErr := ConsoleOpenSubject(tc.node)
			in, inErr := ConsoleInSubject(tc.node, tc.session)
			out, outErr := ConsoleOutSubject(tc.node, tc.session)
			if tc.wantErr {
				var ke *KeyError
				require.ErrorAs(t, errors.Join(openErr, inErr), &ke)
				require.ErrorAs(t, outErr, &ke)
				assert.Empty(t, in)
				assert.Empty(t, out)
				return
			}
			require.NoError(t, errors.Join(openErr, inErr, outErr))
			assert.Equal(t, tc.want, subjects{open: open, in: in, out: out})
		})
	}
}
