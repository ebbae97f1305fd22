package v1alpha1

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestNodeToken(t *testing.T) {
	cases := map[string]struct {
		name, token string
	}{
		"APlainNameIsItsOwnToken":          {name: "node1", token: "node1"},
		"DotsBecomeUnderscores":            {name: "node-1.rack-a.example.com", token: "node-1_rack-a_example_com"},
		"AnEC2NameStaysReadable":           {name: "ip-10-0-0-1.ec2.internal", token: "ip-10-0-0-1_ec2_internal"},
		"AnUnderscoreIsEscaped":            {name: "a_b", token: "a_FPb"},
		"AnUppercaseLetterIsEscaped":       {name: "Node", token: "_EOode"},
		"ADotBeforeAnEscapeIsStillADot":    {name: "a._", token: "a__FP"},
		"ATrailingDotIsATrailingEscape":    {name: "a.", token: "a_"},
		"ANonASCIIByteIsEscapedByteByByte": {name: "é", token: "_MD_KJ"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			assert.Equal(t, tc.token, NodeToken(tc.name))
			require.NoError(t, ValidateToken("node", NodeToken(tc.name)), "a token is one NATS subject token")
			back, err := NodeFromToken(tc.token)
			require.NoError(t, err)
			assert.Equal(t, tc.name, back)
		})
	}
}

func TestNodeFromTokenRefusesWhatNoNameMapsTo(t *testing.T) {
	for name, token := range map[string]string{
		"AnUppercaseLetterOutsideAnEscape":   "Node1",
		"ACutOffEscape":                      "a_E",
		"AnEscapedLetterThatStandsForItself": "_GB",
		"AnEscapedDot":                       "a_COb",
		"AnEmptyToken":                       "",
	} {
		t.Run(name, func(t *testing.T) {
			_, err := NodeFromToken(token)
			var ke *KeyError
			assert.ErrorAs(t, err, &ke)
		})
	}
}

// FuzzNodeToken pins the mapping's promises for any name: a token is one
// valid subject token, it reads back to the name, and two names never share
// a token (which the read-back implies, and which is checked head on by
// mapping a second name).
func FuzzNodeToken(f *testing.F) {
	for _, s := range []string{"node1", "node-1.rack-a.example.com", "a_b", "a._", "_.", "..", "A", "é", "__FP"} {
		f.Add(s, s+".")
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		if ValidateNodeName(a) != nil {
			return
		}
		tok := NodeToken(a)
		if err := ValidateToken("node", tok); err != nil {
			t.Fatalf("token %q of %q: %v", tok, a, err)
		}
		if strings.ContainsAny(tok, ".*> ") {
			t.Fatalf("token %q of %q is not one subject token", tok, a)
		}
		back, err := NodeFromToken(tok)
		if err != nil || back != a {
			t.Fatalf("token %q of %q reads back as %q, %v", tok, a, back, err)
		}
		if a != b && ValidateNodeName(b) == nil && NodeToken(b) == tok {
			t.Fatalf("%q and %q share the token %q", a, b, tok)
		}
	})
}

// FuzzNodeFromToken pins the other direction: whatever a token is, if it
// reads as a name, that name's token is the token itself, so no two tokens
// stand for one name either.
func FuzzNodeFromToken(f *testing.F) {
	for _, s := range []string{"node1", "node-1_rack-a", "a_FPb", "_EOode", "a__FP", "a_", "_GB", "a_E"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, tok string) {
		name, err := NodeFromToken(tok)
		if err != nil {
			return
		}
		if got := NodeToken(name); got != tok {
			t.Fatalf("token %q reads as %q, whose token is %q", tok, name, got)
		}
	})
}
