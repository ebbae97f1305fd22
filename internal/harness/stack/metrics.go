package stack

// The benchmarks read the hub's and the agents' peak memory and CPU time from
// /proc/<pid>; these expose the pids of the processes this stack started.
// Tests read the hub's and the agents' Prometheus metrics from
// HubMetricsURL and AgentMetricsURL.

import "fmt"

// HubMetricsURL is where the hub serves its Prometheus metrics.
func (s *Stack) HubMetricsURL() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return fmt.Sprintf("http://127.0.0.1:%d/metrics", s.portOf(metricsPort, "hub"))
}

// AgentMetricsURL is where node's agent serves its Prometheus metrics, the
// same across its restarts; empty before its first start.
func (s *Stack) AgentMetricsURL(node string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if port := s.portOf(metricsPort, "agent-"+node); port != 0 {
		return fmt.Sprintf("http://127.0.0.1:%d/metrics", port)
	}
	return ""
}

// HubPID is the running hub's process id, or 0 when the hub is not running.
func (s *Stack) HubPID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return pid(s.hub)
}

// AgentPID is the process id of node's running agent, or 0 when it is not
// running.
func (s *Stack) AgentPID(node string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return pid(s.agents[node])
}

func pid(c *component) int {
	if c == nil || c.cmd.Process == nil {
		return 0
	}
	return c.cmd.Process.Pid
}
