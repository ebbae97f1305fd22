// Command printversion prints the version internal/version says the binary
// has, for the tests of the builds that stamp it.
package main

import (
	"fmt"

	"github.com/virtfleet/virtfleet/internal/version"
)

func main() { fmt.Println(version.Get()) }
