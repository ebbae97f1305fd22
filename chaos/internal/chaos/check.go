package chaos

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
)

// testDriverDomain is the domain libvirt's test driver creates in every fresh
// state; it is the simulated host's, not virtfleet's, so it is never an
// orphan.
const testDriverDomain = "test"

// VM is what the API says about one VirtualMachine.
type VM struct {
	Name        string
	UID         string
	WantRunning bool
	// Deleting is set once the VM has a deletion timestamp.
	Deleting bool
	Phase    string
	Node     string
	// Why is the hub's reason for the VM's state: its Ready condition's
	// reason and message (a VM on no node says why no node fits).
	Why string
	// Confirmed is whether the node acted on the VM's current spec (its
	// status' observedGeneration): the hub restarts a VM elsewhere only
	// then, as only then does it know the guest there fences itself.
	Confirmed bool
	// NodeLost is the VM's NodeLost condition's reason and message: when
	// or why not it is restarted elsewhere.
	NodeLost string
}

// Domain is one libvirt domain as the node's daemon lists it.
type Domain struct {
	UUID   string
	Name   string
	Active bool
	// Owner is the uid of the VM its virtfleet metadata names: the VM it
	// was made for, or the one that adopted it. Empty: its UUID is.
	Owner string
	// Orphaned is set on a guest released on purpose (a VM deleted without
	// the Delete management policy): owned by nobody, but not lost.
	Orphaned bool
}

// Kind sorts a problem: Lost, Duplicated and Orphaned are what a chaos run
// must never leave behind, DoubleRunning what must never happen at any
// instant (a VM running on two nodes at once); NotConverged is a state that
// is still on its way.
type Kind string

// Problem kinds.
const (
	Lost         Kind = "lost"
	Duplicated   Kind = "duplicated"
	Orphaned     Kind = "orphaned"
	NotConverged Kind = "not-converged"
	// DoubleRunning is a VM seen running on two nodes in one sample of
	// every node's libvirtd (see sampler).
	DoubleRunning Kind = "double-running"
)

// Problem is one way the fleet differs from what was asked of it.
type Problem struct {
	Kind    Kind
	Message string
}

func (p Problem) String() string { return string(p.Kind) + ": " + p.Message }

// Check compares what should exist (the names the churn created and did not
// delete), what the API holds, and the domains every node's libvirtd holds.
// It returns nothing when every wanted VM exists exactly once, on the node
// its status names, in the power state its spec asks for, with that phase in
// its status, and no other domain exists.
func Check(want map[string]bool, vms []VM, domains map[string][]Domain) []Problem {
	var out []Problem
	add := func(k Kind, format string, args ...any) {
		out = append(out, Problem{Kind: k, Message: fmt.Sprintf(format, args...)})
	}
	byName := map[string]VM{}
	byUID := map[string]VM{}
	for _, vm := range vms {
		byName[vm.Name] = vm
		byUID[vm.UID] = vm
	}
	// Where each uid has a guest, over the whole fleet.
	type place struct {
		node string
		dom  Domain
	}
	guests := map[string][]place{}
	for _, node := range sortedKeys(domains) {
		for _, d := range domains[node] {
			if d.Name == testDriverDomain || d.Orphaned {
				continue
			}
			owner := d.Owner
			if owner == "" {
				owner = d.UUID
			}
			guests[owner] = append(guests[owner], place{node, d})
		}
	}

	for _, name := range sortedKeys(want) {
		if !want[name] {
			continue
		}
		vm, ok := byName[name]
		switch {
		case !ok:
			add(Lost, "VM %s is gone from the API but was never deleted", name)
			continue
		case vm.Deleting:
			add(Lost, "VM %s is being deleted but was never deleted", name)
			continue
		}
		g := guests[vm.UID]
		if len(g) == 0 {
			add(NotConverged, "VM %s (%s) has no guest on any node; status says %s on %q; the hub says: %s", name, vm.UID, vm.Phase, vm.Node, vm.Why)
			continue
		}
		if len(g) > 1 {
			continue // reported below, once per uid
		}
		if g[0].node != vm.Node {
			add(NotConverged, "VM %s runs on %s but its status says %q", name, g[0].node, vm.Node)
		}
		wantPhase := "Stopped"
		if vm.WantRunning {
			wantPhase = "Running"
		}
		if g[0].dom.Active != vm.WantRunning {
			add(NotConverged, "VM %s wants running=%t but its guest on %s is active=%t", name, vm.WantRunning, g[0].node, g[0].dom.Active)
		}
		if vm.Phase != wantPhase {
			add(NotConverged, "VM %s wants phase %s, status says %s; the hub says: %s", name, wantPhase, vm.Phase, vm.Why)
		}
	}
	for _, vm := range vms {
		if !want[vm.Name] {
			add(NotConverged, "VM %s was deleted but is still in the API (phase %s on %q); the hub says: %s", vm.Name, vm.Phase, vm.Node, vm.Why)
		}
	}
	for _, uid := range sortedKeys(guests) {
		g := guests[uid]
		if len(g) > 1 {
			nodes := make([]string, len(g))
			for i := range g {
				nodes[i] = g[i].node
			}
			add(Duplicated, "guest %s exists %d times: on %s", uid, len(g), strings.Join(nodes, ", "))
		}
		vm, ok := byUID[uid]
		switch {
		case !ok:
			add(Orphaned, "domain %s (%s) on %s belongs to no VM", g[0].dom.Name, uid, g[0].node)
		case !want[vm.Name]:
			add(NotConverged, "domain of deleted VM %s is still on %s", vm.Name, g[0].node)
		}
	}
	return out
}

// Census counts each node's domains by whom they belong to, one line per
// node, for a failed run's summary: whether a VM no node takes meets nodes
// really full, and of what.
func Census(vms []VM, domains map[string][]Domain) []string {
	live := map[string]bool{}
	for _, vm := range vms {
		if !vm.Deleting {
			live[vm.UID] = true
		}
	}
	out := make([]string, 0, len(domains))
	for _, node := range sortedKeys(domains) {
		var all, active, ofVM, orphans, ofNone int
		for _, d := range domains[node] {
			if d.Name == testDriverDomain {
				continue
			}
			all++
			if d.Active {
				active++
			}
			owner := cmp.Or(d.Owner, d.UUID)
			switch {
			case d.Orphaned:
				orphans++
			case live[owner]:
				ofVM++
			default:
				ofNone++
			}
		}
		out = append(out, fmt.Sprintf("%s: %d domains (%d active): %d of live VMs, %d orphaned, %d of no live VM", node, all, active, ofVM, orphans, ofNone))
	}
	return out
}

// Fatal are the problems that no amount of waiting excuses: a duplicated
// guest is one at any moment.
func Fatal(ps []Problem) []Problem {
	var out []Problem
	for _, p := range ps {
		if p.Kind == Duplicated {
			out = append(out, p)
		}
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
