package deploy_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"
	"github.com/google/uuid"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	pkgv1 "github.com/crossplane/crossplane/apis/v2/pkg/v1"

	computev1alpha1 "github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/harness/crossplanetest"
)

// virtfleet upgraded as the README's "Upgrading" tells a user, from
// v0.0.0-deploy-test to v0.0.0-deploy-test-2 (builds of this tree that
// differ in the version they are stamped with): first the Provider's
// package, which makes Crossplane create a new ProviderRevision and its
// Deployment and delete the old one's, then the agent DaemonSet's image,
// which the DaemonSet controller rolls node by node.
//
// The guests are the node's libvirtd's, outside the agent's pod (its
// socket is mounted from the host), each in a QEMU of its own: a real
// hypervisor whose network namespace the kubelet node shares. Each guest's
// domain, by UUID, by the id libvirtd gave it when it started and by its
// QEMU's process, is the same before and after, and its VM's restartCount
// unchanged. One guest, asked for by a claim through virtfleet's XRD and
// composed by its function (which Crossplane runs on the node beside the
// hub), boots Debian: its claim shows it Running at its address before
// and after, its boot id is the same after, an ssh session opened before
// is still open, and a neighbour on its network that pings it five times
// a second throughout loses no reply; after, its serial console opens with
// kubectl virtfleet console through the API server, the new hubs and the
// new agent.
//
// Throughout, at most one hub leads (by each hub pod's
// leader_election_master_status, sampled with the Lease's holder), none
// that does not lead reconciles, and the old leader releases the Lease as
// it stops, so that the new hub need not wait for it to expire; a VM
// created while the hub rolls
// (a hub of v2 with agents of v1) and one created while the agents roll
// come up Running; a stop issued afterwards works. At the end every hub
// reports v2 in its build info and the HypervisorNode the agent's v2.
// Last the hub is rolled back to v1, the Provider's package as it was,
// and, with the agents still at v2, a new VM runs and stops.
func TestUpgradeTouchesNoGuest(t *testing.T) {
	skipWithoutKubelet(t)
	const v1, v2 = imageVersion, imageVersion + "-2"
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancel()
	inst := installPackage(t, startRealHost(ctx, t), v1, v2)
	f, cp := inst.fleet, inst.cp

	vms := []*computev1alpha1.VirtualMachine{f.runVM(ctx, t, "vm-a")}
	t.Logf("first VM Running %s after the Provider was applied", time.Since(inst.applied).Round(100*time.Millisecond))
	vms = append(vms, f.runVM(ctx, t, "vm-b"))
	start := time.Now()
	booted, bootID := f.bootGuest(ctx, t, "debian")
	vms = append(vms, booted)
	t.Logf("VM %s booted Debian and let ssh in at %s %s after it was applied", booted.Name, guestAddress(booted), time.Since(start).Round(100*time.Millisecond))
	guests := map[string]guest{}
	restarts := map[string]int32{}
	for _, vm := range vms {
		guests[vm.Name] = f.guestOf(t, vm)
		restarts[vm.Name] = vm.Status.AtProvider.RestartCount
	}
	var provider pkgv1.Provider
	require.NoError(t, inst.x.Client.Get(ctx, client.ObjectKey{Name: crossplanetest.Provider}, &provider))
	oldRev := provider.Status.CurrentRevision
	require.NotEmpty(t, oldRev)

	w := f.watchUpgrade(t)
	sess := f.openSession(ctx, t, booted)
	ping := f.startProber(ctx, t, booted)
	pinged := time.Now()

	// The hub: the Provider's package to v2.
	start = time.Now()
	patch, err := json.Marshal(map[string]any{"spec": map[string]any{"package": inst.releases[v2].provider}})
	require.NoError(t, err)
	inst.kubectl("patch", "provider.pkg.crossplane.io/"+crossplanetest.Provider, "--type", "merge", "-p", string(patch))
	duringHub := f.createVM(ctx, t, "vm-during-hub")
	newRev := inst.awaitRevision(ctx, t, oldRev)
	// awaitRevision saw only the new revision's pods.
	leader := awaitLeader(ctx, t, cp, hubPods(ctx, t, cp))
	hubDone := time.Since(start)
	t.Logf("revision %s Healthy and its hub %s leading %s after the Provider's package was changed; %s Inactive",
		newRev, leader, hubDone.Round(100*time.Millisecond), oldRev)
	for _, p := range hubPods(ctx, t, cp) {
		assert.Equal(t, []string{v2}, buildVersions(f.hubMetrics(t, &p)), "hub %s", p.Name)
	}
	// A hub of v2 with the agents still at v1.
	f.awaitPhase(ctx, t, duringHub, computev1alpha1.PhaseRunning)
	assert.Equal(t, v1, f.agentVersion(ctx, t), "the agents rolled before the DaemonSet was changed")
	t.Logf("VM created as the hub rolled Running %s after the Provider's package was changed", time.Since(start).Round(100*time.Millisecond))

	// The agents: the DaemonSet's image to v2, rolled by its controller.
	agentStart := time.Now()
	inst.kubectl("-n", "virtfleet-system", "set", "image", "daemonset/virtfleet-agent", "agent="+inst.releases[v2].agent)
	duringAgents := f.createVM(ctx, t, "vm-during-agents")
	inst.kubectl("-n", "virtfleet-system", "rollout", "status", "daemonset/virtfleet-agent", "--timeout=5m")
	err = wait.PollUntilContextCancel(ctx, 500*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		return f.agentVersion(ctx, t) == v2, nil
	})
	require.NoError(t, err, "the HypervisorNode does not show the agent's new version")
	agentsDone := time.Since(agentStart)
	t.Logf("agents rolled to %s in %s; upgrade (Provider applied to the new hub leading and every agent at %s) took %s",
		v2, agentsDone.Round(100*time.Millisecond), v2, (hubDone + agentsDone).Round(100*time.Millisecond))
	f.awaitPhase(ctx, t, duringAgents, computev1alpha1.PhaseRunning)
	t.Logf("VM created as the agents rolled Running %s after the DaemonSet's image was changed", time.Since(agentStart).Round(100*time.Millisecond))

	s := w.stop()
	t.Logf("no hub leading for %s; no heartbeat for %s at most; Lease holders %v",
		s.leaderless.Round(100*time.Millisecond), s.heartbeatGap.Round(100*time.Millisecond), s.holders)
	assert.Empty(t, s.violations, "hubs reconciled at once")
	// A Lease held by another is taken only once it expired, unless its
	// holder released it: the watch of the Lease seeing it without a holder
	// proves the release, and so does a new holder that acquired it before
	// the old holder's last renewal expired. A new hub's pod that starts
	// after that expiry takes a released Lease later than it.
	if assert.NotEmpty(t, s.handovers, "the watch saw the Lease change hands never") {
		for _, h := range s.handovers {
			t.Logf("Lease passed from %s to %s %s before the former's last renewal would have expired; released: %v", h.from, h.to, h.expires.Sub(h.acquired).Round(100*time.Millisecond), s.released[h.from])
			assert.True(t, s.released[h.from] || h.acquired.Before(h.expires), "%s acquired the Lease at %s, not before %s's last renewal expired at %s, and the watch of the Lease saw no release: the stopping hub did not release it",
				h.to, h.acquired.Format(time.RFC3339Nano), h.from, h.expires.Format(time.RFC3339Nano))
		}
	}
	assert.GreaterOrEqual(t, s.leaders, 2, "the watch saw no hand-over: every sample missed a leader")

	upgraded := time.Now()
	require.NoError(t, ping.WaitAnswer(ctx, upgraded, time.Minute), "the guest no longer answers its neighbour")
	sent, lost := ping.Unanswered(pinged, upgraded)
	gap, _, _ := ping.Gap(pinged, upgraded)
	t.Logf("the neighbour sent %d echo requests to %s through the upgrade, one per %s: %d unanswered, the longest time between replies %s",
		sent, booted.Name, ping.Interval(), lost, gap.Round(time.Millisecond))
	assert.Zero(t, lost, "the guest's network went away during the upgrade")
	open, lines := sess.alive()
	assert.True(t, open, "the ssh session to %s ended during the upgrade, after %d lines", booted.Name, lines)
	assert.Equal(t, bootID, f.bootID(ctx, t, booted), "VM %s's guest booted again", booted.Name)
	address := guestAddress(booted)
	for _, vm := range vms {
		require.NoError(t, cp.Client.Get(ctx, client.ObjectKeyFromObject(vm), vm))
		assert.Equal(t, computev1alpha1.PhaseRunning, vm.Status.AtProvider.Phase, vm.Name)
		assert.Equal(t, restarts[vm.Name], vm.Status.AtProvider.RestartCount, "VM %s restarted", vm.Name)
		assert.Equal(t, guests[vm.Name], f.guestOf(t, vm), "VM %s's domain was recreated or restarted", vm.Name)
	}
	assert.Equal(t, address, guestAddress(booted), "VM %s's status lost its address", booted.Name)
	f.awaitClaim(ctx, t, booted)
	start = time.Now()
	f.console(ctx, t, inst.kubectlCommand, booted)
	t.Logf("VM %s's login prompt on kubectl virtfleet console %s after it was opened", booted.Name, time.Since(start).Round(100*time.Millisecond))

	// Rolled back: the Provider's package to v1 again, with the agents
	// left at v2, which Crossplane runs as a revision of its own.
	start = time.Now()
	patch, err = json.Marshal(map[string]any{"spec": map[string]any{"package": inst.releases[v1].provider}})
	require.NoError(t, err)
	inst.kubectl("patch", "provider.pkg.crossplane.io/"+crossplanetest.Provider, "--type", "merge", "-p", string(patch))
	rolledBack := inst.awaitRevision(ctx, t, newRev)
	t.Logf("revision %s of %s Healthy %s after the Provider's package was changed back", rolledBack, v1, time.Since(start).Round(100*time.Millisecond))
	for _, p := range hubPods(ctx, t, cp) {
		assert.Equal(t, []string{v1}, buildVersions(f.hubMetrics(t, &p)), "hub %s", p.Name)
	}
	afterRollback := f.runVM(ctx, t, "vm-after-rollback")
	t.Logf("hub rolled back to %s and a VM Running with agents of %s %s after the Provider's package was changed",
		v1, f.agentVersion(ctx, t), time.Since(start).Round(100*time.Millisecond))
	assert.Equal(t, v2, f.agentVersion(ctx, t))
	f.stopThroughAPI(ctx, t, inst.kubectl, afterRollback)
	f.stopThroughAPI(ctx, t, inst.kubectl, vms[0])
}

// guest is what the node's libvirtd knows a guest by: its domain's UUID
// (the VM's uid), and the id it gave the domain when it last started and
// the process of its QEMU, which a restart or a new definition changes.
type guest struct {
	uuid libvirt.UUID
	id   int32
	pid  int
}

// guestOf is vm's guest on the node's libvirtd, which must run it.
func (f *fleet) guestOf(t *testing.T, vm *computev1alpha1.VirtualMachine) guest {
	t.Helper()
	l, dom := lookupDomain(t, f.libvirt, vm)
	defer l.Disconnect() //nolint:errcheck // read-only
	state, _, err := l.DomainGetState(dom, 0)
	require.NoError(t, err)
	require.Equal(t, int32(libvirt.DomainRunning), state, "VM %s's domain is not running", vm.Name)
	g := guest{uuid: dom.UUID, id: dom.ID}
	if f.real != nil {
		g.pid = f.real.qemuPID(t, dom.Name)
	}
	return g
}

// lookupDomain connects to the libvirtd h dials and finds vm's domain
// there, by its UUID (the VM's uid); the caller disconnects.
func lookupDomain(t *testing.T, h interface {
	Dial() (*libvirt.Libvirt, error)
}, vm *computev1alpha1.VirtualMachine,
) (*libvirt.Libvirt, libvirt.Domain) {
	t.Helper()
	u, err := uuid.Parse(string(vm.UID))
	require.NoError(t, err)
	l, err := h.Dial()
	require.NoError(t, err)
	dom, err := l.DomainLookupByUUID(libvirt.UUID(u))
	if err != nil {
		_ = l.Disconnect()
	}
	require.NoError(t, err, "the node's libvirtd has no domain for VM %s", vm.Name)
	return l, dom
}

// agentVersion is the node's agent's version as its HypervisorNode shows it.
func (f *fleet) agentVersion(ctx context.Context, t *testing.T) string {
	t.Helper()
	var hn computev1alpha1.HypervisorNode
	require.NoError(t, f.cp.Client.Get(ctx, client.ObjectKey{Name: node}, &hn))
	return hn.Status.AgentVersion
}

// awaitRevision waits until the Provider's current revision is another
// than old, Healthy, with old Inactive, and only the new revision's hub
// pods, both of them, running; it returns the new revision's name.
func (inst *packageInstall) awaitRevision(ctx context.Context, t *testing.T, old string) string {
	t.Helper()
	var (
		revs  pkgv1.ProviderRevisionList
		state string
		rev   string
	)
	err := wait.PollUntilContextCancel(ctx, time.Second, true, func(ctx context.Context) (bool, error) {
		var p pkgv1.Provider
		if err := inst.x.Client.Get(ctx, client.ObjectKey{Name: crossplanetest.Provider}, &p); err != nil {
			return false, err
		}
		rev = p.Status.CurrentRevision
		if err := inst.x.Client.List(ctx, &revs, client.MatchingLabels{pkgv1.LabelParentPackage: crossplanetest.Provider}); err != nil {
			return false, err
		}
		states := map[string]revisionState{}
		for _, r := range revs.Items {
			states[r.Name] = revisionState{r.Spec.DesiredState, r.GetCondition(pkgv1.TypeRevisionHealthy).Status}
		}
		state = fmt.Sprint(states)
		if rev == old || states[rev] != (revisionState{pkgv1.PackageRevisionActive, corev1.ConditionTrue}) ||
			states[old].desired != pkgv1.PackageRevisionInactive {
			return false, nil
		}
		pods := hubPods(ctx, t, inst.cp)
		for _, p := range pods {
			if p.Labels[pkgv1.LabelRevision] != rev || p.Status.Phase != corev1.PodRunning {
				return false, nil
			}
		}
		return len(pods) == 2, nil
	})
	require.NoError(t, err, "the Provider did not move from revision %s to a Healthy one running alone: current %s, revisions %s", old, rev, state)
	return rev
}

// revisionState is a ProviderRevision's desired state and whether it is
// Healthy.
type revisionState struct {
	desired pkgv1.PackageRevisionDesiredState
	healthy corev1.ConditionStatus
}

// upgradeWatch samples, while an upgrade runs, who leads among the hubs
// and whether the agent heartbeats.
type upgradeWatch struct {
	cancel context.CancelFunc
	done   chan struct{}

	// leaseWatch ends once the watch of the Lease has.
	leaseWatch sync.WaitGroup

	mu sync.Mutex
	s  upgradeSummary
}

// upgradeSummary is what an upgradeWatch saw.
type upgradeSummary struct {
	// violations are samples where two hubs led, or a hub that did not
	// lead reconciled.
	violations []string
	// leaders is how many hub pods were seen leading.
	leaders int
	// holders are the Lease's holders in turn.
	holders []string
	// handovers are the Lease's changes from one holder to another.
	handovers []handover
	// released are the holders the watch of the Lease saw release it.
	released map[string]bool
	// leaderless is the longest time no hub pod said it led.
	leaderless time.Duration
	// heartbeatGap is the longest time between two of the agent's heartbeats.
	heartbeatGap time.Duration
}

// handover is the Lease passing from one holder to another, as the
// watch's samples saw it.
type handover struct {
	from, to string
	// expires is when from's last renewal the watch saw would have
	// expired; acquired is when to took the Lease.
	expires, acquired time.Time
}

// hubSample is one hub pod's word, from its metrics.
type hubSample struct {
	leading    bool
	reconciles float64
}

// watchUpgrade starts sampling every half second until stop.
func (f *fleet) watchUpgrade(t *testing.T) *upgradeWatch {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w := &upgradeWatch{cancel: cancel, done: make(chan struct{}), s: upgradeSummary{released: map[string]bool{}}}
	t.Cleanup(func() { w.stop() })
	w.watchReleases(ctx, t, f.cp.Config, f.cp.Scheme)
	key, err := wire.NodeKey(node)
	require.NoError(t, err)
	kv, err := f.hub.KeyValue(ctx, wire.BucketNodes)
	require.NoError(t, err)
	scrape := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		DialContext: func(_ context.Context, _, addr string) (net.Conn, error) { return f.node.Dial(addr) },
	}}
	go func() {
		defer close(w.done)
		prev := map[string]hubSample{}
		everLed := map[string]bool{}
		now := time.Now()
		lastLeader, lastBeat := now, now
		var beat uint64
		// held is the Lease as its last holder last renewed it.
		var held coordinationv1.LeaseSpec
		_ = wait.PollUntilContextCancel(ctx, 500*time.Millisecond, true, func(ctx context.Context) (bool, error) {
			now := time.Now()
			var lease coordinationv1.Lease
			holder := ""
			if f.cp.Client.Get(ctx, client.ObjectKey{Namespace: crossplanetest.Namespace, Name: "virtfleet-hub"}, &lease) == nil && lease.Spec.HolderIdentity != nil {
				holder = *lease.Spec.HolderIdentity
			}
			var pods corev1.PodList
			_ = f.cp.Client.List(ctx, &pods, client.InNamespace(crossplanetest.Namespace),
				client.MatchingLabels{"pkg.crossplane.io/provider": crossplanetest.Provider})
			cur := map[string]hubSample{}
			var leading []string
			for _, p := range pods.Items {
				if p.Status.PodIP == "" {
					continue
				}
				s, err := scrapeHub(ctx, scrape, p.Status.PodIP)
				if err != nil {
					continue // not serving yet, or gone
				}
				cur[p.Name] = s
				if s.leading {
					leading = append(leading, p.Name)
					everLed[p.Name] = true
				}
			}
			if e, err := kv.Get(ctx, key); err == nil && e.Revision() != beat {
				beat = e.Revision()
				lastBeat = now
			}
			w.mu.Lock()
			defer w.mu.Unlock()
			if n := len(w.s.holders); holder != "" && (n == 0 || w.s.holders[n-1] != holder) {
				w.s.holders = append(w.s.holders, holder)
				if h, ok := handoverOf(held, lease.Spec); ok {
					w.s.handovers = append(w.s.handovers, h)
				}
			}
			if holder != "" {
				held = lease.Spec
			}
			if len(leading) > 1 {
				w.s.violations = append(w.s.violations, fmt.Sprintf("%s: %v all lead", now.Format(time.RFC3339Nano), leading))
			}
			for name, s := range cur {
				if p, ok := prev[name]; ok && !p.leading && !s.leading && s.reconciles > p.reconciles {
					w.s.violations = append(w.s.violations, fmt.Sprintf("%s: %s reconciled %v times without leading", now.Format(time.RFC3339Nano), name, s.reconciles-p.reconciles))
				}
			}
			prev = cur
			w.s.leaders = len(everLed)
			if len(leading) > 0 {
				lastLeader = now
			}
			w.s.leaderless = max(w.s.leaderless, now.Sub(lastLeader))
			w.s.heartbeatGap = max(w.s.heartbeatGap, now.Sub(lastBeat))
			return false, nil
		})
	}()
	return w
}

// watchReleases records, until ctx is done, the holders of the hubs'
// Lease that released it: client-go's leader election empties the holder
// when its holder stops. The samples, half a second apart, can miss a
// release that a new holder follows at once; a watch sees every change.
func (w *upgradeWatch) watchReleases(ctx context.Context, t *testing.T, cfg *rest.Config, scheme *k8sruntime.Scheme) {
	t.Helper()
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: scheme})
	require.NoError(t, err)
	leases, err := c.Watch(ctx, &coordinationv1.LeaseList{}, client.InNamespace(crossplanetest.Namespace),
		client.MatchingFields{"metadata.name": "virtfleet-hub"})
	require.NoError(t, err)
	w.leaseWatch.Go(func() {
		defer leases.Stop()
		holder := ""
		for {
			select {
			case <-ctx.Done():
				return
			case ev, ok := <-leases.ResultChan():
				if !ok {
					return
				}
				lease, ok := ev.Object.(*coordinationv1.Lease)
				if !ok {
					continue
				}
				now := ""
				if lease.Spec.HolderIdentity != nil {
					now = *lease.Spec.HolderIdentity
				}
				if holder != "" && now == "" {
					w.mu.Lock()
					w.s.released[holder] = true
					w.mu.Unlock()
				}
				holder = now
			}
		}
	})
}

// handoverOf is the handover from the holder of held to that of now, when
// both have one and they differ.
func handoverOf(held, now coordinationv1.LeaseSpec) (handover, bool) {
	if held.HolderIdentity == nil || now.HolderIdentity == nil || *held.HolderIdentity == *now.HolderIdentity ||
		held.RenewTime == nil || held.LeaseDurationSeconds == nil || now.AcquireTime == nil {
		return handover{}, false
	}
	return handover{
		from:     *held.HolderIdentity,
		to:       *now.HolderIdentity,
		expires:  held.RenewTime.Add(time.Duration(*held.LeaseDurationSeconds) * time.Second),
		acquired: now.AcquireTime.Time,
	}, true
}

// stop ends the watch and returns what it saw.
func (w *upgradeWatch) stop() upgradeSummary {
	w.cancel()
	<-w.done
	w.leaseWatch.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.s
}

// scrapeHub reads whether the hub at ip leads (controller-runtime's
// leader_election_master_status) and how often it reconciled
// (controller_runtime_reconcile_total), from its metrics port.
func scrapeHub(ctx context.Context, c *http.Client, ip string) (hubSample, error) {
	families, err := scrape(ctx, c, net.JoinHostPort(ip, "8080"))
	if err != nil {
		return hubSample{}, err
	}
	var s hubSample
	for _, m := range families["leader_election_master_status"].GetMetric() {
		s.leading = s.leading || m.GetGauge().GetValue() == 1
	}
	for _, m := range families["controller_runtime_reconcile_total"].GetMetric() {
		s.reconciles += m.GetCounter().GetValue()
	}
	return s, nil
}

// scrape reads the metrics served at addr (host:port) with c.
func scrape(ctx context.Context, c *http.Client, addr string) (map[string]*dto.MetricFamily, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close() //nolint:errcheck // read-only body
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("metrics: %s", resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	return parser.TextToMetricFamilies(resp.Body)
}
