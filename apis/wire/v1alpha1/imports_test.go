package v1alpha1

import (
	"go/build"
	"strings"
	"testing"
)

// TestImportsOnlyTheStandardLibrary keeps the wire readable by any client: a
// Kubernetes or NATS import here would leak into every speaker of the protocol.
func TestImportsOnlyTheStandardLibrary(t *testing.T) {
	pkg, err := build.ImportDir(".", 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(pkg.Imports) == 0 {
		t.Fatal("found no imports at all; the test is not looking at the package")
	}
	for _, imp := range pkg.Imports {
		// Standard library import paths have no dot in their first element.
		if first, _, _ := strings.Cut(imp, "/"); strings.Contains(first, ".") {
			t.Errorf("package imports %q; the wire must use the standard library only", imp)
		}
	}
}
