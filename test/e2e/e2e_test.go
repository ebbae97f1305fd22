// Package e2e runs the README's quick start as a user would: `make run` as a
// real process (control plane, NATS, hub and agents as processes), then only
// kubectl — the one it built — against the kubeconfig it printed.
package e2e

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/virtfleet/virtfleet/apis/compute/v1alpha1"
	"github.com/virtfleet/virtfleet/internal/harness/controlplane"
	"github.com/virtfleet/virtfleet/internal/harness/freeport"
	"github.com/virtfleet/virtfleet/internal/harness/libvirttest"
)

func TestQuickStart(t *testing.T) {
	if testing.Short() {
		t.Skip("runs make run and the whole stack; skipped with -short")
	}
	t.Parallel()
	takeSlot(t) // make run's stack, not startStack's
	dir := runDir(t, "vf-e2e-")
	port := freePort(t)
	run := makeRun(t, dir, port)
	k := kubectl{t: t, path: run.kubectl, kubeconfig: run.kubeconfig}

	t.Run("KubectlGetVMPrintsTheSeedTable", func(t *testing.T) {
		k.wait("vm/sample-vm", "{.status.atProvider.phase}=Running", 90*time.Second)
		lines := k.lines("get", "vm", "sample-vm")
		require.Len(t, lines, 2)
		assert.Equal(t, []string{"NAME", "STATUS", "RESTARTS", "AGE"}, strings.Fields(lines[0]))
		assert.Equal(t, []string{"sample-vm", "Running", "0"}, strings.Fields(lines[1])[:3])
	})

	t.Run("WideViewShowsNodeAndAddressesFromLibvirt", func(t *testing.T) {
		lines := k.lines("get", "vm", "sample-vm", "-o", "wide")
		assert.Equal(t, []string{"NAME", "STATUS", "RESTARTS", "AGE", "NODE", "NETWORKS(IP)", "READY", "SYNCED"}, strings.Fields(lines[0]))
		assert.Regexp(t, `^sample-vm\s+Running\s+0\s+\S+\s+node[123]\s+net-db\(10\.10\.120\.\d+\), net-backend\(10\.10\.150\.\d+\), net-frontend\(10\.10\.110\.\d+\)\s+True\s+True$`, lines[1])
	})

	t.Run("TheWebExamplesTakeTheirShapeFromAnInstanceType", func(t *testing.T) {
		k.wait("vm/web-1", "{.status.atProvider.phase}=Running", 90*time.Second)
		assert.Equal(t, "tiny 1 256Mi", k.run("get", "vm", "web-1", "-o", "jsonpath={.status.instancetypeRef.name} {.status.atProvider.declared.vcpu} {.status.atProvider.declared.memory}"),
			"web-1 names the instance type tiny and asks for its shape")
		assert.Equal(t, "1 256Mi", k.run("get", "vm", "web-1", "-o", "jsonpath={.status.atProvider.vcpu} {.status.atProvider.memory}"), "the guest runs the shape")
		assert.Regexp(t, `^tiny\s+1\s+256Mi\s`, k.lines("get", "vmcit", "tiny")[1])
	})

	t.Run("DescribeShowsEvents", func(t *testing.T) {
		out := k.run("describe", "vm", "sample-vm")
		assert.Contains(t, out, "Scheduled")
		assert.Contains(t, out, "Started")
	})

	t.Run("ExplainDocumentsTheFields", func(t *testing.T) {
		assert.Contains(t, k.run("explain", "vm.spec.forProvider.vcpu"), "number of virtual CPUs")
	})

	t.Run("PatchRunningFalseStopsAndTrueStarts", func(t *testing.T) {
		k.run("patch", "vm", "sample-vm", "--type=merge", "-p", `{"spec":{"forProvider":{"running":false}}}`)
		k.wait("vm/sample-vm", "{.status.atProvider.phase}=Stopped", 30*time.Second)
		k.run("patch", "vm", "sample-vm", "--type=merge", "-p", `{"spec":{"forProvider":{"running":true}}}`)
		k.wait("vm/sample-vm", "{.status.atProvider.phase}=Running", 30*time.Second)
	})

	t.Run("RestartAnnotationCountsOneRestart", func(t *testing.T) {
		k.run("annotate", "vm", "sample-vm", "--overwrite", v1alpha1.AnnotationRestartRequestedAt+"="+time.Now().Format(time.RFC3339))
		k.wait("vm/sample-vm", "{.status.atProvider.restartCount}=1", 30*time.Second)
	})

	t.Run("SpecChangeWhileRunningIsRestartRequired", func(t *testing.T) {
		// A swap disk is added only at a start: vCPUs and memory within the
		// guest's maximum would change live.
		k.run("patch", "vm", "sample-vm", "--type=merge", "-p", `{"spec":{"forProvider":{"swap":"512Mi"}}}`)
		k.wait("vm/sample-vm", "condition=RestartRequired", 30*time.Second)
		assert.Equal(t, "Running", k.run("get", "vm", "sample-vm", "-o", "jsonpath={.status.atProvider.phase}"))
	})

	t.Run("AFleetSpreadsOverTheThreeNodes", func(t *testing.T) {
		k.applyObjects(fleet()...)
		nodes := map[string]int{}
		for i := range fleetSize {
			name := fmt.Sprintf("fleet-%02d", i)
			k.wait("vm/"+name, "{.status.atProvider.phase}=Running", 90*time.Second)
			nodes[k.run("get", "vm", name, "-o", "jsonpath={.status.atProvider.node}")]++
		}
		assert.Len(t, nodes, 3, "placement spreads VMs over every node: %v", nodes)
	})

	t.Run("HypervisorNodesShowTheFleetAndACordonedNodeGetsNoNewVM", func(t *testing.T) {
		header := strings.Fields(k.lines("get", "hypervisornodes")[0])
		assert.Equal(t, []string{"NAME", "READY", "CORDONED", "DRAIN", "BACKEND", "VMS", "ALLOCATED", "AGE"}, header)
		nodes := []string{"node1", "node2", "node3"}
		for _, n := range nodes {
			k.wait("hvnode/"+n, "condition=Ready", 30*time.Second)
			assert.Equal(t, "libvirt", k.run("get", "hvnode", n, "-o", "jsonpath={.status.backend}"))
			assert.NotEqual(t, "0", k.run("get", "hvnode", n, "-o", "jsonpath={.status.capacity.vcpu}"), "%s offers vCPUs", n)
			assert.Regexp(t, `^\d+/\d+ vCPU, \S+/\S+$`, k.run("get", "hvnode", n, "-o", "jsonpath={.status.summary}"))
		}
		// The VM counts settle once the fleet's placements are written.
		require.Eventually(t, func() bool {
			total := 0
			for _, n := range nodes {
				c, _ := strconv.Atoi(k.run("get", "hvnode", n, "-o", "jsonpath={.status.virtualMachines}"))
				total += c
			}
			return total == len(k.lines("get", "vm", "--no-headers"))
		}, 30*time.Second, 500*time.Millisecond, "every VM counted on its node")

		for _, n := range nodes {
			k.run("patch", "hvnode", n, "--type=merge", "-p", `{"spec":{"unschedulable":true}}`)
		}
		vm := fleetVMs()[0]
		vm.Name, vm.Spec.ForProvider.DiskAttachments = "after-cordon", []v1alpha1.DiskAttachment{{Name: "after-cordon-root"}}
		k.applyObjects(&v1alpha1.Volume{
			TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.SchemeGroupVersion.String(), Kind: v1alpha1.VolumeKind},
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "after-cordon-root"},
			Spec:       v1alpha1.VolumeSpec{ForProvider: v1alpha1.VolumeParameters{Size: resource.MustParse("1Gi")}},
		}, vm)
		require.Eventually(t, func() bool {
			return strings.Contains(k.run("get", "vm", "after-cordon", "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].message}`), "cordoned")
		}, 30*time.Second, 500*time.Millisecond, "a VM with every node cordoned says so")
		assert.Empty(t, k.run("get", "vm", "after-cordon", "-o", "jsonpath={.status.atProvider.node}"))

		k.run("patch", "hvnode", "node2", "--type=merge", "-p", `{"spec":{"unschedulable":false}}`)
		k.wait("vm/after-cordon", "{.status.atProvider.phase}=Running", 60*time.Second)
		assert.Equal(t, "node2", k.run("get", "vm", "after-cordon", "-o", "jsonpath={.status.atProvider.node}"), "placed on the one node uncordoned")
		for _, n := range nodes {
			k.run("patch", "hvnode", n, "--type=merge", "-p", `{"spec":{"unschedulable":false}}`)
		}
	})

	t.Run("ADrainOfNodesThatTakeNoMigrationsIsBlockedSayingWhy", func(t *testing.T) {
		// make run's nodes announce no migration URI (libvirt's test
		// driver cannot migrate): a drain's migrations fail at once and
		// the drain says which VM blocks it, and nothing moves.
		node := k.run("get", "vm", "after-cordon", "-o", "jsonpath={.status.atProvider.node}")
		k.run("patch", "hvnode", node, "--type=merge", "-p", `{"spec":{"drain":true}}`)
		require.Eventually(t, func() bool {
			return k.run("get", "hvnode", node, "-o", "jsonpath={.status.drain.phase}") == string(v1alpha1.DrainBlocked)
		}, 30*time.Second, 500*time.Millisecond, "the drain of %s is blocked", node)
		msg := k.run("get", "hvnode", node, "-o", "jsonpath={.status.drain.message}")
		assert.Contains(t, msg, "default/after-cordon: migration after-cordon-drain-")
		assert.Contains(t, msg, "takes no part in live migration")
		assert.Equal(t, node, k.run("get", "vm", "after-cordon", "-o", "jsonpath={.status.atProvider.node}"))
		k.run("patch", "hvnode", node, "--type=merge", "-p", `{"spec":{"drain":false}}`)
		k.run("delete", "vmim", "--all", "-n", "default", "--timeout=30s")
	})

	t.Run("EveryAddressOfANetworkIsOneVMs", func(t *testing.T) {
		// The hub's allocation, as the NetworkAddresses record it and as the
		// VMs' status shows it, over VMs on all three nodes.
		holders := map[string]string{}
		for _, line := range k.lines("get", "networkaddresses", "-o", `jsonpath={range .items[*]}{.spec.network}/{.spec.address} {.spec.virtualMachine}{"\n"}{end}`) {
			addr, vm, ok := strings.Cut(line, " ")
			require.True(t, ok, line)
			require.NotContains(t, holders, addr, "%s is given twice", addr)
			holders[addr] = vm
		}
		seen := map[string]string{}
		for _, line := range k.lines("get", "vm", "-o", `jsonpath={range .items[*]}{.metadata.name}{range .status.atProvider.interfaces[*]} {.network}/{.ips[0]}{end}{"\n"}{end}`) {
			fields := strings.Fields(line)
			for _, addr := range fields[1:] {
				assert.NotContains(t, seen, addr, "%s shows %s, which %s shows too", fields[0], addr, seen[addr])
				seen[addr] = fields[0]
				assert.Equal(t, fields[0], holders[addr], "%s shows %s, which the hub gave to %q", fields[0], addr, holders[addr])
			}
		}
		assert.GreaterOrEqual(t, len(seen), fleetSize, "every fleet VM shows its address")
	})

	t.Run("DeleteKeepsVolumesAndNetworks", func(t *testing.T) {
		k.run("delete", "vm", "web-1", "--timeout=60s")
		assert.Contains(t, k.run("get", "vm"), "sample-vm")
		assert.NotContains(t, k.run("get", "vm"), "web-1")
		k.run("get", "volume", "web-1-root")
		k.run("get", "virtualnetwork", "net-frontend", "net-backend")
	})

	t.Run("ATenantTourOnMakeRun", func(t *testing.T) {
		// The README's "Try it: a tenant on make run", command for
		// command: alice, with rights in team-a alone, attacks the fleet
		// three ways and each fails as the README says.
		file := func(name string) string {
			return filepath.Join(controlplane.RepoRoot(), "cluster", "local", "tenant", name)
		}
		alice := func(args ...string) string {
			return k.in("team-a").run(append([]string{"--as", "alice"}, args...)...)
		}
		k.in("team-a").run("apply", "-f", file("access.yaml"))
		// The apiserver's authorizer sees a new RoleBinding a moment after
		// the write; until then alice may do nothing.
		require.Eventually(t, func() bool {
			out, _ := k.in("team-a").command("--as", "alice", "auth", "can-i", "create", "virtualmachines.compute.virtfleet.io").Output()
			return strings.TrimSpace(string(out)) == "yes"
		}, 30*time.Second, 200*time.Millisecond, "alice is never allowed what access.yaml grants")
		out, err := k.command("--as", "alice", "get", "hvnode").CombinedOutput()
		require.Error(t, err, "alice reads nothing outside team-a: %s", out)
		assert.Contains(t, string(out), "forbidden")

		alice("apply", "-f", file("hostile.yaml"))
		require.Eventually(t, func() bool {
			return strings.Contains(alice("get", "vm", "hostile", "-o", `jsonpath={.status.conditions[?(@.type=="Synced")].message}`),
				"refused: the ProviderConfig names NATS server 127.0.0.1:9, which no ClusterProviderConfig names")
		}, 30*time.Second, 500*time.Millisecond, "alice's VM says its server is refused")
		start := time.Now()
		k.run("apply", "-f", file("bystander.yaml"))
		k.run("wait", "vm/bystander", "--for=jsonpath={.status.atProvider.phase}=Running", "--timeout=60s")
		t.Logf("bystander Running %s after it was applied, beside alice's hostile ProviderConfig", time.Since(start).Round(100*time.Millisecond))
		assert.Empty(t, alice("get", "vm", "hostile", "-o", "jsonpath={.status.atProvider.node}"), "alice's VM is placed nowhere")

		alice("apply", "-f", file("web.yaml"))
		alice("wait", "vm/web", "--for=jsonpath={.status.atProvider.phase}=Running", "--timeout=60s")
		node := alice("get", "vm", "web", "-o", "jsonpath={.status.atProvider.node}")
		uid := alice("get", "vm", "web", "-o", "jsonpath={.metadata.uid}")
		alice("annotate", "vm", "web", v1alpha1.AnnotationNode+"-", v1alpha1.AnnotationSeal+"-")
		require.Eventually(t, func() bool {
			return alice("get", "vm", "web", "-o", "jsonpath={.metadata.annotations.compute\\.virtfleet\\.io/node}") == node &&
				alice("get", "events", "--field-selector", "reason=Rebound,involvedObject.name=web", "-o", "name") != ""
		}, 30*time.Second, 500*time.Millisecond, "web is bound again to %s, with a Rebound event", node)
		assert.Equal(t, "Running", alice("get", "vm", "web", "-o", "jsonpath={.status.atProvider.phase}"))
		alice("delete", "vm", "web", "--timeout=60s")
		for _, n := range []string{"node1", "node2", "node3"} {
			assert.Zero(t, domainsWithUUID(t, findAgent(t, dir, n).socket, uid), "a guest of the deleted VM is left on %s", n)
		}

		alice("apply", "-f", file("big.yaml"))
		require.Eventually(t, func() bool {
			return strings.Contains(alice("get", "vm", "big", "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].message}`),
				"quota of namespace team-a exceeded: vcpu would be 32 of 16 (TenantQuota team-a;")
		}, 30*time.Second, 500*time.Millisecond, "big is refused by team-a's quota")
		assert.Empty(t, alice("get", "vm", "big", "-o", "jsonpath={.status.atProvider.node}"), "big is placed nowhere")

		for _, f := range []string{"big.yaml", "hostile.yaml", "web.yaml"} {
			alice("delete", "-f", file(f), "--ignore-not-found", "--timeout=60s")
		}
		k.run("delete", "-f", file("bystander.yaml"), "--timeout=60s")
	})

	t.Run("KilledAgentShowsUnknownThenRecoversWithoutDuplicates", func(t *testing.T) {
		node := k.run("get", "vm", "sample-vm", "-o", "jsonpath={.status.atProvider.node}")
		uid := k.run("get", "vm", "sample-vm", "-o", "jsonpath={.metadata.uid}")
		agent := findAgent(t, dir, node)
		require.NoError(t, syscall.Kill(agent.pid, syscall.SIGKILL))
		// How soon the loss shows is the heartbeat's TTL plus the load on
		// the machine; it is logged, and the waits are bounds, not
		// measurements.
		start := time.Now()
		k.wait("vm/sample-vm", "{.status.atProvider.phase}=Unknown", time.Minute)
		t.Logf("Unknown %s after kill -9 of the agent", time.Since(start).Round(100*time.Millisecond))
		k.wait("hvnode/"+node, "condition=Ready=false", time.Minute)
		t.Logf("its HypervisorNode not Ready %s after", time.Since(start).Round(100*time.Millisecond))
		agent.restart(t)
		k.wait("vm/sample-vm", "{.status.atProvider.phase}=Running", 60*time.Second)
		assert.Equal(t, 1, domainsWithUUID(t, agent.socket, uid), "exactly one domain for the VM on %s", node)
	})

	t.Run("InvalidManifestsAreRejectedNamingTheField", func(t *testing.T) {
		bad := fleetVMs()[0]
		bad.Name, bad.Spec.ForProvider.Vcpu = "bad-vcpu", 0
		out, err := k.apply(bad)
		require.Error(t, err, out)
		// vcpu 0 is vcpu unset (omitempty): the rule that a VM names an
		// instancetype or sets vcpu refuses it, naming the field.
		assert.Contains(t, out, "spec.forProvider.vcpu")
		assert.Contains(t, out, "vcpu is required unless the VM names an instancetype")
		bad.Name, bad.Spec.ForProvider.Vcpu, bad.Spec.ForProvider.VirtualNetworks = "bad-net", 1, []v1alpha1.LocalName{"Not_A_Name"}
		out, err = k.apply(bad)
		require.Error(t, err, out)
		assert.Contains(t, out, "spec.forProvider.virtualNetworks[0]")
	})

	t.Run("ASecondMakeRunSaysOneIsRunning", func(t *testing.T) {
		second := exec.Command("make", "run", fmt.Sprintf("RUN_FLAGS=-dir %s -nats-port %d", dir, freePort(t)))
		second.Dir = controlplane.RepoRoot()
		out, err := second.CombinedOutput()
		require.Error(t, err)
		assert.Contains(t, string(out), "already running")
	})

	t.Run("CtrlCStopsAndKeepRestoresTheFleet", func(t *testing.T) {
		run.interrupt(t)
		again := makeRun(t, dir, port, "-keep")
		k := kubectl{t: t, path: again.kubectl, kubeconfig: again.kubeconfig}
		assert.Contains(t, k.run("get", "vm"), "fleet-09", "resources survive a KEEP=1 run")
		k.wait("vm/sample-vm", "{.status.atProvider.phase}=Running", 90*time.Second)
		again.interrupt(t)
	})
}

// run is a `make run` in progress.
type run struct {
	cmd        *exec.Cmd
	kubeconfig string
	kubectl    string
	stderr     *bytes.Buffer

	mu      sync.Mutex
	tail    strings.Builder // what the run printed after its instructions
	drained chan struct{}   // closed when stdout reached EOF
}

// runBuild is `make local`, the build `make run` starts with, done once.
var runBuild struct {
	once sync.Once
	out  []byte
	err  error
}

// buildForRun builds what `make run` runs, so that makeRun's bound on the
// start is the start's alone: beside the whole suite on two cores,
// compiling the commands takes minutes, and make run's own build then
// finds them up to date.
func buildForRun(t *testing.T) {
	t.Helper()
	runBuild.once.Do(func() {
		cmd := exec.Command("make", "--no-print-directory", "local")
		cmd.Dir = controlplane.RepoRoot()
		runBuild.out, runBuild.err = cmd.CombinedOutput()
	})
	require.NoError(t, runBuild.err, "make local: %s", runBuild.out)
}

// makeRun starts `make run` on dir and reads its output until it says how to
// use it, as a user would.
func makeRun(t *testing.T, dir string, port int, extra ...string) *run {
	t.Helper()
	buildForRun(t)
	flags := append([]string{"-dir", dir, "-nats-port", strconv.Itoa(port)}, extra...)
	cmd := exec.Command("make", "run", "RUN_FLAGS="+strings.Join(flags, " "))
	cmd.Dir = controlplane.RepoRoot()
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // Ctrl-C goes to the whole group
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	r := &run{cmd: cmd, stderr: &bytes.Buffer{}, drained: make(chan struct{})}
	cmd.Stderr = r.stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })

	var printed strings.Builder
	lines := bufio.NewScanner(stdout)
	timer := time.AfterFunc(5*time.Minute, func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
	for lines.Scan() {
		printed.WriteString(lines.Text() + "\n")
		if strings.HasPrefix(lines.Text(), "Ctrl-C stops everything") {
			break
		}
	}
	timer.Stop()
	require.Contains(t, printed.String(), "Ctrl-C stops everything", "stdout:\n%s\nstderr:\n%s", printed.String(), r.stderr.String())
	for _, component := range []string{"control plane", "nats", "hub", "agent node1", "agent node2", "agent node3", "examples"} {
		assert.Regexp(t, `(?m)^  `+component+`\s`, printed.String(), "one summary line per component")
	}
	kc := regexp.MustCompile(`export KUBECONFIG=(\S+)`).FindStringSubmatch(printed.String())
	kb := regexp.MustCompile(`alias kubectl=(\S+)`).FindStringSubmatch(printed.String())
	require.Len(t, kc, 2, printed.String())
	require.Len(t, kb, 2, printed.String())
	r.kubeconfig, r.kubectl = kc[1], kb[1]
	go func() {
		defer close(r.drained)
		for lines.Scan() { // keep the pipe drained, and what it says
			r.mu.Lock()
			r.tail.WriteString(lines.Text() + "\n")
			r.mu.Unlock()
		}
	}()
	return r
}

// interrupt sends Ctrl-C to the whole process group, as a terminal does, and
// waits until the run says it stopped. make itself then exits reporting the
// interrupt, as it does for any interrupted recipe.
func (r *run) interrupt(t *testing.T) {
	t.Helper()
	require.NoError(t, syscall.Kill(-r.cmd.Process.Pid, syscall.SIGINT))
	select {
	case <-r.drained:
		_ = r.cmd.Wait() // make reports the interrupt; the run's own words are checked below
	case <-time.After(time.Minute):
		t.Fatal("make run did not stop within a minute of Ctrl-C")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	assert.Contains(t, r.tail.String(), "stopped", "the run reports a clean stop; stderr:\n%s", r.stderr.String())
}

type kubectl struct {
	t          *testing.T
	path       string
	kubeconfig string
	// namespace is the one kubectl is told; empty is default.
	namespace string
}

// in is k in namespace ns.
func (k kubectl) in(ns string) kubectl {
	k.namespace = ns
	return k
}

func (k kubectl) command(args ...string) *exec.Cmd {
	ns := k.namespace
	if ns == "" {
		ns = "default"
	}
	cmd := exec.Command(k.path, append([]string{"-n", ns}, args...)...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+k.kubeconfig)
	return cmd
}

// run runs kubectl and fails the test when it fails.
func (k kubectl) run(args ...string) string {
	k.t.Helper()
	out, err := k.command(args...).CombinedOutput()
	require.NoError(k.t, err, "kubectl %s:\n%s", strings.Join(args, " "), out)
	return strings.TrimSpace(string(out))
}

func (k kubectl) lines(args ...string) []string {
	k.t.Helper()
	return strings.Split(k.run(args...), "\n")
}

// wait is kubectl wait --for, which users reach for too.
func (k kubectl) wait(object, condition string, timeout time.Duration) {
	k.t.Helper()
	forArg := "--for=jsonpath=" + condition
	if strings.HasPrefix(condition, "condition=") {
		forArg = "--for=" + condition
	}
	out, err := k.command("wait", object, forArg, "--timeout="+timeout.String()).CombinedOutput()
	if err != nil {
		status, _ := k.command("get", object, "-o", "yaml").CombinedOutput()
		k.t.Fatalf("kubectl wait %s %s: %v\n%s\n%s", object, forArg, err, out, status)
	}
}

// apply writes objs as YAML and kubectl-applies the file.
func (k kubectl) apply(objs ...any) (string, error) {
	k.t.Helper()
	var docs []string
	for _, o := range objs {
		b, err := yaml.Marshal(o)
		require.NoError(k.t, err)
		docs = append(docs, string(b))
	}
	f := filepath.Join(k.t.TempDir(), "vms.yaml")
	require.NoError(k.t, os.WriteFile(f, []byte(strings.Join(docs, "---\n")), 0o600))
	out, err := k.command("apply", "-f", f).CombinedOutput()
	return string(out), err
}

func (k kubectl) applyObjects(objs ...any) {
	k.t.Helper()
	out, err := k.apply(objs...)
	require.NoError(k.t, err, out)
}

// fleetSize is how many 1-vCPU VMs the fleet has: enough that placement,
// which puts each VM on the least allocated node, reaches every node even
// when the examples' VMs (4 + 1 + 1 vCPUs once sample-vm asked for 4) all
// landed on node3: the first 12 level node1 and node2 up to it, the next two
// break the tie by name, and the 15th goes to node3.
const fleetSize = 15

// fleet are fleetSize small VMs on net-db, each booting from a volume of its own
// so placement is free to spread them, volumes first.
func fleet() []any {
	var vols, vms []any
	for i, vm := range fleetVMs() {
		vols = append(vols, &v1alpha1.Volume{
			TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.SchemeGroupVersion.String(), Kind: v1alpha1.VolumeKind},
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: fmt.Sprintf("fleet-%02d-root", i)},
			Spec:       v1alpha1.VolumeSpec{ForProvider: v1alpha1.VolumeParameters{Size: resource.MustParse("1Gi")}},
		})
		vms = append(vms, vm)
	}
	return append(vols, vms...)
}

// fleetVMs are the VMs of fleet.
func fleetVMs() []*v1alpha1.VirtualMachine {
	out := make([]*v1alpha1.VirtualMachine, 0, 10)
	for i := range fleetSize {
		name := fmt.Sprintf("fleet-%02d", i)
		out = append(out, &v1alpha1.VirtualMachine{
			TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.SchemeGroupVersion.String(), Kind: v1alpha1.VirtualMachineKind},
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
			Spec: v1alpha1.VirtualMachineSpec{ForProvider: v1alpha1.VirtualMachineParameters{
				Vcpu:            1,
				Memory:          resource.MustParse("128Mi"),
				VirtualNetworks: []v1alpha1.LocalName{"net-db"},
				DiskAttachments: []v1alpha1.DiskAttachment{{Name: v1alpha1.LocalName(name + "-root")}},
			}},
		})
	}
	return out
}

// agentProcess is a running agent found by its command line.
type agentProcess struct {
	pid    int
	args   []string
	socket string
	logs   string
}

func findAgent(t *testing.T, dir, node string) agentProcess {
	t.Helper()
	creds := filepath.Join(dir, "credentials", node+".nk")
	entries, err := os.ReadDir("/proc")
	require.NoError(t, err)
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		raw, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !bytes.Contains(raw, []byte("--nats-credentials="+creds)) {
			continue
		}
		args := strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
		a := agentProcess{pid: pid, args: args, logs: filepath.Join(dir, "logs", "agent-"+node+".log")}
		for _, arg := range args {
			if v, ok := strings.CutPrefix(arg, "--libvirt-socket="); ok {
				a.socket = v
			}
		}
		return a
	}
	t.Fatalf("no agent process for %s", node)
	return agentProcess{}
}

// restart starts the agent again with the same command line, as a
// DaemonSet's kubelet would; the test stops it at the end.
func (a agentProcess) restart(t *testing.T) {
	t.Helper()
	f, err := os.OpenFile(a.logs, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	require.NoError(t, err)
	cmd := exec.Command(a.args[0], a.args[1:]...) //nolint:gosec // the agent's own command line
	cmd.Stdout, cmd.Stderr = f, f
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		_ = f.Close()
	})
}

// domainsWithUUID counts the node's libvirt domains with the given UUID.
func domainsWithUUID(t *testing.T, socket, uid string) int {
	t.Helper()
	l, err := libvirttest.Dial(socket)
	require.NoError(t, err)
	defer func() { _ = l.Disconnect() }()
	doms, _, err := l.ConnectListAllDomains(1, 0)
	require.NoError(t, err)
	n := 0
	for _, d := range doms {
		if uuid.UUID(d.UUID).String() == uid {
			n++
		}
	}
	return n
}

func freePort(t *testing.T) int {
	t.Helper()
	p, err := freeport.Pick()
	require.NoError(t, err)
	return p
}
