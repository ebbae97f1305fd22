package v1alpha1

import (
	"encoding/json"
	"testing"
)

// The fuzz targets only assert that hostile bytes never panic and that what
// decodes cleanly re-encodes and decodes to the same thing.

func seed(f *testing.F, examples ...any) {
	for _, e := range examples {
		b, err := json.Marshal(e)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte(`{"protocolVersion":2}`))
	f.Add([]byte(`{"protocolVersion":1,"uid":"a.b","node":"*"}`))
	f.Add([]byte(`null`))
	f.Add([]byte(`{"protocolVersion":1e400}`))
}

func FuzzDecodeIntent(f *testing.F) {
	seed(f, exampleIntent())
	f.Fuzz(func(t *testing.T, b []byte) {
		in, err := DecodeIntent(b)
		if err != nil {
			return
		}
		again, err := EncodeIntent(in)
		if err != nil {
			t.Fatalf("decoded intent does not re-encode: %v", err)
		}
		if _, err := DecodeIntent(again); err != nil {
			t.Fatalf("re-encoded intent does not decode: %v", err)
		}
	})
}

func FuzzDecodeReport(f *testing.F) {
	seed(f, exampleReport())
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := DecodeReport(b)
		if err != nil {
			return
		}
		again, err := EncodeReport(r)
		if err != nil {
			t.Fatalf("decoded report does not re-encode: %v", err)
		}
		if _, err := DecodeReport(again); err != nil {
			t.Fatalf("re-encoded report does not decode: %v", err)
		}
	})
}

func FuzzDecodeNodeHeartbeat(f *testing.F) {
	seed(f, exampleHeartbeat())
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := DecodeNodeHeartbeat(b)
		if err != nil {
			return
		}
		again, err := EncodeNodeHeartbeat(h)
		if err != nil {
			t.Fatalf("decoded heartbeat does not re-encode: %v", err)
		}
		if _, err := DecodeNodeHeartbeat(again); err != nil {
			t.Fatalf("re-encoded heartbeat does not decode: %v", err)
		}
	})
}

func FuzzParseKey(f *testing.F) {
	for _, k := range []string{"node1.abc", "node1.volume.abc", "node1", "..", "a.>", "*.b"} {
		f.Add(k)
	}
	f.Fuzz(func(t *testing.T, key string) {
		node, rest, err := ParseKey(key)
		if err != nil {
			return
		}
		if node+"."+rest != key {
			t.Fatalf("ParseKey(%q) = %q, %q does not rebuild the key", key, node, rest)
		}
	})
}
