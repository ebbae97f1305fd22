// Command function is virtfleet's composition function (see
// function/compose): a gRPC server Crossplane calls for every composite
// VirtualMachine. Crossplane runs it from the Function package, or an
// external runtime runs it with --address and --tls-server-certs-dir.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/crossplane/function-sdk-go"

	"github.com/virtfleet/virtfleet/function/compose"
)

func main() {
	address := flag.String("address", ":9443", "Address to serve gRPC on.")
	// The flag and its environment variable are the ones Crossplane's
	// function runtime passes to a Function's Deployment.
	certs := flag.String("tls-server-certs-dir", os.Getenv("TLS_SERVER_CERTS_DIR"), "Directory holding tls.crt, tls.key and ca.crt for mTLS.")
	insecure := flag.Bool("insecure", false, "Serve without TLS (local development only).")
	debug := flag.Bool("debug", false, "Log at debug level.")
	flag.Parse()

	if err := run(*address, *certs, *insecure, *debug); err != nil {
		fmt.Fprintln(os.Stderr, "function:", err)
		os.Exit(1)
	}
}

func run(address, certs string, insecure, debug bool) error {
	log, err := function.NewLogger(debug)
	if err != nil {
		return err
	}
	return function.Serve(&compose.Function{Log: log},
		function.Listen("tcp", address),
		function.MTLSCertificates(certs),
		function.Insecure(insecure))
}
