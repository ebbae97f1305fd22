package stack

import (
	"fmt"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/virtfleet/virtfleet/internal/harness/freeport"
)

// What a component's kept port serves (keptPort).
const (
	metricsPort = "metrics"
	pprofPort   = "profiles"
)

// keptPort is component's (hub, agent-NODE) port for what, picked at its
// first start and kept across its restarts, so that whatever reads it
// finds it again; s.mu is held.
func (s *Stack) keptPort(what, component string) (int, error) {
	key := what + " " + component
	if s.ports[key] == 0 {
		port, err := freeport.Pick()
		if err != nil {
			return 0, errors.Wrapf(err, "cannot pick a port for the %s of %s", what, component)
		}
		if s.ports == nil {
			s.ports = map[string]int{}
		}
		s.ports[key] = port
	}
	return s.ports[key], nil
}

// portOf is the port keptPort picked for component's what, or 0 before
// its first start; s.mu is held.
func (s *Stack) portOf(what, component string) int { return s.ports[what+" "+component] }

// pprofArg is the --pprof-bind-address of component; s.mu is held.
func (s *Stack) pprofArg(component string) (string, error) {
	port, err := s.keptPort(pprofPort, component)
	return fmt.Sprintf("--pprof-bind-address=127.0.0.1:%d", port), err
}

// PprofAddress is where component (hub, agent-NODE) serves Go's profiles
// under Options.Pprof, or empty.
func (s *Stack) PprofAddress(component string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if port := s.portOf(pprofPort, component); port != 0 {
		return fmt.Sprintf("127.0.0.1:%d", port)
	}
	return ""
}
