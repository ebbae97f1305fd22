// Package flagenv is the one configuration convention of virtfleet's
// commands (hub, agent and the tools): every flag can also be set by an
// environment variable named VIRTFLEET_ and the flag's name in capitals with
// dashes as underscores (--nats-url: VIRTFLEET_NATS_URL). The command line
// wins over the environment, the environment over the flag's default, and
// each flag's help names its variable.
//
// A Deployment or DaemonSet can so configure a command either way, and a
// malformed value in the environment is an error, never silently the
// default. The standard library's flag package stays: kingpin's DefaultEnvars
// and kong's env tags do the same, but would be a dependency and a second
// flag syntax for this alone.
package flagenv

import (
	"flag"
	"fmt"
	"os"
	"strings"
)

// Prefix starts every variable's name.
const Prefix = "VIRTFLEET_"

// Name is the environment variable of the flag called flagName.
func Name(flagName string) string {
	return Prefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// Lookup finds an environment variable, as os.LookupEnv does.
type Lookup func(string) (string, bool)

// Parse parses args into fs, then sets every flag the command line did not
// set from its variable, parsed as the flag parses its value. Also names
// further variables per flag, read after the flag's own when that is unset:
// for names a platform sets, such as POD_NAMESPACE. Call it instead of
// fs.Parse, after every flag is defined.
func Parse(fs *flag.FlagSet, args []string, lookup Lookup, also map[string][]string) error {
	fs.VisitAll(func(f *flag.Flag) {
		names := append([]string{Name(f.Name)}, also[f.Name]...)
		f.Usage += " (env " + strings.Join(names, ", ") + ")"
	})
	if err := fs.Parse(args); err != nil {
		return err
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if given[f.Name] || err != nil {
			return
		}
		for _, name := range append([]string{Name(f.Name)}, also[f.Name]...) {
			v, ok := lookup(name)
			if !ok {
				continue
			}
			if e := fs.Set(f.Name, v); e != nil {
				err = fmt.Errorf("%s: %w", name, e)
			}
			return
		}
	})
	return err
}

// ParseCommandLine is Parse of the program's own flags, arguments and
// environment, with no further variables.
func ParseCommandLine() error {
	return Parse(flag.CommandLine, os.Args[1:], os.LookupEnv, nil)
}
