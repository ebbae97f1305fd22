package v1alpha1

import (
	"encoding/json"
	"testing"
	"time"
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

// fuzzDecode seeds f with examples and checks that whatever decode accepts
// re-encodes and decodes again.
func fuzzDecode[T any](f *testing.F, decode func([]byte) (T, error), encode func(T) ([]byte, error), examples ...any) {
	seed(f, examples...)
	f.Fuzz(func(t *testing.T, b []byte) {
		v, err := decode(b)
		if err != nil {
			return
		}
		again, err := encode(v)
		if err != nil {
			t.Fatalf("decoded %T does not re-encode: %v", v, err)
		}
		if _, err := decode(again); err != nil {
			t.Fatalf("re-encoded %T does not decode: %v", v, err)
		}
	})
}

func FuzzDecodeIntent(f *testing.F) {
	fuzzDecode(f, DecodeIntent, EncodeIntent, exampleIntent(), exampleClonedIntent())
}

func FuzzDecodeReport(f *testing.F) {
	fuzzDecode(f, DecodeReport, EncodeReport, exampleReport())
}

func FuzzDecodeNodeHeartbeat(f *testing.F) {
	fuzzDecode(f, DecodeNodeHeartbeat, EncodeNodeHeartbeat, exampleHeartbeat())
}

func FuzzDecodeVolumeIntent(f *testing.F) {
	fuzzDecode(f, DecodeVolumeIntent, EncodeVolumeIntent, exampleVolumeIntent())
}

func FuzzDecodeVolumeReport(f *testing.F) {
	fuzzDecode(f, DecodeVolumeReport, EncodeVolumeReport, exampleVolumeReport())
}

func FuzzDecodeImageReport(f *testing.F) {
	importing := exampleImageReport()
	importing.Phase, importing.SizeBytes, importing.Message = ImagePhaseImporting, 0, "importing image debian-13: 10 of 20 bytes"
	fuzzDecode(f, DecodeImageReport, EncodeImageReport, exampleImageReport(), importing)
}

func FuzzDecodeBackupIntent(f *testing.F) {
	incremental := validBackupIntent()
	incremental.Since, incremental.Spec = "b0", []byte(`{"vcpu":2}`)
	fuzzDecode(f, DecodeBackupIntent, EncodeBackupIntent, validBackupIntent(), incremental)
}

func FuzzDecodeBackupReport(f *testing.F) {
	at := time.Date(2026, 12, 2, 4, 0, 0, 0, time.UTC)
	fuzzDecode(f, DecodeBackupReport, EncodeBackupReport,
		BackupReport{UID: "b1", Node: "node-1", VM: "vm1", Phase: BackupPhaseRunning, StartedAt: &at, BytesRead: 1 << 20, ObservedAt: at},
		BackupReport{UID: "b1", Node: "node-1", VM: "vm1", Phase: BackupPhaseFailed, Message: "access denied", ObservedAt: at})
}

func FuzzDecodeConsoleOpen(f *testing.F) {
	serial := exampleConsoleOpen()
	serial.Kind = ConsoleSerial
	fuzzDecode(f, DecodeConsoleOpen, EncodeConsoleOpen, exampleConsoleOpen(), serial)
}

func FuzzParseKey(f *testing.F) {
	for _, k := range []string{"node1.abc", "node1.volume.abc", "node1.image.abc", "node1", "..", "a.>", "*.b"} {
		f.Add(k)
	}
	f.Fuzz(func(t *testing.T, key string) {
		node, rest, err := ParseKey(key)
		if err != nil {
			return
		}
		prefix, err := NodeKeyPrefix(node)
		if err != nil || prefix+rest != key {
			t.Fatalf("ParseKey(%q) = %q, %q does not rebuild the key (%v)", key, node, rest, err)
		}
	})
}
