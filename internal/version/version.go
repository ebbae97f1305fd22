// Package version is the version of virtfleet's commands, which the hub and
// the agent report (the agent in its heartbeat, which the hub shows in its
// HypervisorNode's status; both in a build-info metric), so that an upgrade
// can tell which binaries run where.
package version

import "runtime/debug"

// stamped is the version an image build gave the binary
// (internal/build/ociimage), with the linker's -X Symbol=VERSION.
var stamped string

// Symbol is the linker's name of the stamped version: a build gives the
// binary version v1.2.3 with -ldflags "-X Symbol=v1.2.3".
const Symbol = "github.com/virtfleet/virtfleet/internal/version.stamped"

// Unknown is the version of a binary built with neither a stamped version
// nor a module version Go knows (a plain `go build` of a tree Go reads no
// version control information of).
const Unknown = "(devel)"

// Get is the binary's version: the stamped one, else the main module's
// version in Go's build information (a `go install …@v1.2.3`, or the
// pseudo-version Go derives from the repository's tags and commit), else
// Unknown.
func Get() string {
	if stamped != "" {
		return stamped
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return Unknown
}
