package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/util/uuid"
	"libvirt.org/go/libvirtxml"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/chaos/internal/chaos"
	"github.com/virtfleet/virtfleet/internal/harness/stack"
)

// TestShortChaosCatchesInjectedFaults shows the checks can fail: after the
// libvirtd's restart it deletes a VM behind the churn's back (lost),
// defines a second guest of another VM on a node it does not run on
// (duplicated) and a guest of no VM (orphaned); after the partition's heal
// it starts a copy of a running VM on a third node (running twice); and it
// expects the run to report all four. It costs more than TestShortChaos
// (each later fault waits out the convergence limit), so it runs only with
// VIRTFLEET_CHAOS_SELFTEST=1.
func TestShortChaosCatchesInjectedFaults(t *testing.T) {
	if os.Getenv("VIRTFLEET_CHAOS_SELFTEST") == "" {
		t.Skip("set VIRTFLEET_CHAOS_SELFTEST=1 to show the chaos checks fail on injected faults")
	}
	ctrl.SetLogger(logr.Discard())
	o := chaos.Defaults()
	o.VMs, o.OpsPerSecond, o.HAVMs = 24, 6, 8
	o.Down, o.ChurnBetween, o.NodeTTL = 2*time.Second, 3*time.Second, 5*time.Second
	o.ConvergeWithin = 10 * time.Second
	o.Progress = testWriter{t}
	o.BeforeCheck = func(ctx context.Context, s *stack.Stack, f chaos.FaultResult) error {
		switch f.Kind {
		case chaos.FaultLibvirtd:
			return breakAfterLibvirtd(ctx, t, s)
		case chaos.FaultPartition:
			return runTwiceAfterPartition(ctx, t, s, f.Target)
		}
		return nil
	}
	r, err := chaos.Run(context.Background(), o)
	require.NoError(t, err)
	t.Log("\n" + chaos.Summary(r))
	all := strings.Join(r.Failures, "\n")
	for _, kind := range []chaos.Kind{chaos.Lost, chaos.Duplicated, chaos.Orphaned, chaos.DoubleRunning} {
		assert.Contains(t, all, string(kind)+":", "the run must report the injected %s guest", kind)
	}
}

// breakAfterLibvirtd deletes a VM, defines a second guest of another and
// a guest of no VM.
func breakAfterLibvirtd(ctx context.Context, t *testing.T, s *stack.Stack) error {
	kube := s.ControlPlane.Client
	l := &v1alpha1.VirtualMachineList{}
	if err := kube.List(ctx, l, client.InNamespace("chaos")); err != nil {
		return err
	}
	var victim, twin *v1alpha1.VirtualMachine
	for i := range l.Items {
		vm := &l.Items[i]
		switch {
		case vm.DeletionTimestamp != nil || vm.Status.AtProvider.Node == "":
		case victim == nil:
			victim = vm
		case twin == nil:
			twin = vm
		}
	}
	if twin == nil {
		return fmt.Errorf("no two VMs to break")
	}
	t.Logf("injecting: delete VM %s; second guest of %s; an orphan guest", victim.Name, twin.Name)
	if err := kube.Delete(ctx, victim); err != nil {
		return err
	}
	other := "node1"
	if twin.Status.AtProvider.Node == other {
		other = "node2"
	}
	if err := define(s, other, "chaos-twin", string(twin.UID), false); err != nil {
		return err
	}
	return define(s, "node3", "chaos-orphan", string(uuid.NewUUID()), false)
}

// runTwiceAfterPartition starts, on a node that is neither its own nor the
// one that was cut off, a copy of a running VM: the sampler must see it run
// on two nodes at once.
func runTwiceAfterPartition(ctx context.Context, t *testing.T, s *stack.Stack, cut string) error {
	l := &v1alpha1.VirtualMachineList{}
	if err := s.ControlPlane.Client.List(ctx, l, client.InNamespace("chaos")); err != nil {
		return err
	}
	for i := range l.Items {
		vm := &l.Items[i]
		on := vm.Status.AtProvider.Node
		if vm.DeletionTimestamp != nil || vm.Status.AtProvider.Phase != v1alpha1.PhaseRunning || on == "" || on == cut {
			continue
		}
		for _, other := range []string{"node1", "node2", "node3"} {
			if other != on && other != cut {
				t.Logf("injecting: a copy of %s (running on %s) started on %s", vm.Name, on, other)
				return define(s, other, "chaos-double", string(vm.UID), true)
			}
		}
	}
	return fmt.Errorf("no running VM to copy")
}

// define defines a guest behind virtfleet's back, and starts it with start.
func define(s *stack.Stack, node, name, uid string, start bool) error {
	l, err := s.Nodes[node].Dial()
	if err != nil {
		return err
	}
	defer func() { _ = l.Disconnect() }()
	x, err := (&libvirtxml.Domain{
		Type: "test", Name: name, UUID: uid,
		Memory: &libvirtxml.DomainMemory{Value: 64, Unit: "MiB"},
		OS:     &libvirtxml.DomainOS{Type: &libvirtxml.DomainOSType{Type: "hvm"}},
	}).Marshal()
	if err != nil {
		return err
	}
	d, err := l.DomainDefineXML(x)
	if err != nil || !start {
		return err
	}
	return l.DomainCreate(d)
}
