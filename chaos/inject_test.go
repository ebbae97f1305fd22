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
// last restart it deletes a VM behind the churn's back (lost), defines a
// second guest of another VM on a node it does not run on (duplicated) and
// a guest of no VM (orphaned), and expects the run to report all three.
// It costs as much as TestShortChaos, so it runs only with
// VIRTFLEET_CHAOS_SELFTEST=1.
func TestShortChaosCatchesInjectedFaults(t *testing.T) {
	if os.Getenv("VIRTFLEET_CHAOS_SELFTEST") == "" {
		t.Skip("set VIRTFLEET_CHAOS_SELFTEST=1 to show the chaos checks fail on injected faults")
	}
	ctrl.SetLogger(logr.Discard())
	o := chaos.Defaults()
	o.VMs, o.OpsPerSecond = 24, 6
	o.Down, o.ChurnBetween, o.NodeTTL = 2*time.Second, 3*time.Second, 5*time.Second
	o.ConvergeWithin = 10 * time.Second
	o.Progress = testWriter{t}
	o.BeforeCheck = func(ctx context.Context, s *stack.Stack, f chaos.FaultResult) error {
		if f.Kind != chaos.FaultLibvirtd {
			return nil
		}
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
		if err := define(s, other, "chaos-twin", string(twin.UID)); err != nil {
			return err
		}
		return define(s, "node3", "chaos-orphan", string(uuid.NewUUID()))
	}
	r, err := chaos.Run(context.Background(), o)
	require.NoError(t, err)
	t.Log("\n" + chaos.Summary(r))
	all := strings.Join(r.Failures, "\n")
	for _, kind := range []chaos.Kind{chaos.Lost, chaos.Duplicated, chaos.Orphaned} {
		assert.Contains(t, all, string(kind)+":", "the run must report the injected %s guest", kind)
	}
}

// define defines a guest behind virtfleet's back.
func define(s *stack.Stack, node, name, uid string) error {
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
	_, err = l.DomainDefineXML(x)
	return err
}
