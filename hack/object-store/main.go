// Command object-store prints the path of SeaweedFS's weed binary, the S3
// object store the backup tests and `make run` start, building it once per
// machine from the Go module proxy when needed (see internal/harness/s3test).
// Progress goes to stderr, the path to stdout.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"

	"github.com/virtfleet/virtfleet/internal/harness/s3test"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	bin, err := s3test.Ensure(ctx, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "object-store:", err)
		os.Exit(1)
	}
	fmt.Println(bin)
}
