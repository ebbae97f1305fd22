package openstack

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/virtfleet/virtfleet/internal/harness/guesthost"
	"github.com/virtfleet/virtfleet/internal/harness/procs"
)

// A test binary killed before it stops its cloud (go test's timeout, a
// cancelled CI job) takes with it only the services' direct children, by
// their parent-death signal. What they started stays: RabbitMQ's beam.smp
// (the child is the rabbitmq-server script) and Erlang's helpers, which
// run in sessions of their own, uwsgi's and Nova's workers, the real
// compute host's QEMU and dnsmasq, and with them the DHCP namespaces, the
// loop devices over the cloud's volumes and the cloud's directory. Each
// cloud is recorded in runDir, locked while its test binary lives
// (procs.Record), and the next Start, whichever test binary's, removes
// the clouds whose record nobody locks.

// dirPrefix begins the name of the directories Start makes.
const dirPrefix = "virtfleet-openstack-"

// record names a cloud in runDir.
type record struct {
	Dir string `json:"dir"`
	// Keep says the directory is the caller's (Options.Dir), which Stop
	// leaves in place.
	Keep bool `json:"keep,omitempty"`
	// Owner is the test process, for the progress to name.
	Owner int `json:"owner"`
}

// runDir holds the records of the machine's clouds.
func runDir() string { return filepath.Join(os.TempDir(), "virtfleet-openstack") }

// recordName is a cloud's record's name in runDir: its directory's, which
// no other running cloud has.
func recordName(dir string) string {
	return strings.TrimPrefix(strings.ReplaceAll(filepath.Clean(dir), "/", "_"), "_")
}

// removeLeftovers removes the clouds of test binaries that were killed
// before they stopped them, saying what it removed on progress. A cloud it
// could not remove keeps its record, for the next Start to retry.
func removeLeftovers(ctx context.Context, progress io.Writer) error {
	return procs.RemoveAbandoned(runDir(), func(rec record) error {
		return removeCloud(ctx, rec, progress)
	})
}

// removeCloud kills every process of rec's cloud, then removes its DHCP
// namespaces and bridges, its loop devices and, unless it is the caller's,
// its directory.
func removeCloud(ctx context.Context, rec record, progress io.Writer) error {
	if !filepath.IsAbs(rec.Dir) || filepath.Clean(rec.Dir) == "/" ||
		(!rec.Keep && !strings.HasPrefix(filepath.Base(rec.Dir), dirPrefix)) {
		return errors.Errorf("the record %+v is not a cloud's", rec)
	}
	say := func(format string, args ...any) {
		fmt.Fprintf(progress, "openstack: "+format+"\n", args...)
	}
	say("removing the cloud in %s that killed test process %d left behind", rec.Dir, rec.Owner)
	killed, err := killCloud(ctx, rec.Dir)
	if len(killed) > 0 {
		say("killed %d processes: %s", len(killed), strings.Join(killed, ", "))
	}
	if err != nil {
		return err
	}
	for _, r := range removeNetworks(rec.Dir, nil) {
		say("removed %s", r)
	}
	for _, l := range detachLoops(filepath.Join(rec.Dir, "volumes")) {
		say("detached %s", l)
	}
	if rec.Keep {
		return nil
	}
	if err := os.RemoveAll(rec.Dir); err != nil {
		return errors.Wrapf(err, "cannot remove the cloud's directory %s", rec.Dir)
	}
	say("removed %s", rec.Dir)
	return nil
}

// killCloud kills the processes of the cloud in dir until none is left,
// and names those it killed.
func killCloud(ctx context.Context, dir string) ([]string, error) {
	var killed []string
	seen := map[int]bool{}
	var left []int
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		left = left[:0]
		err := eachProcess(dir, func(pid, pidfd int) {
			if !seen[pid] {
				seen[pid] = true
				name, _ := procs.Command(pid)
				killed = append(killed, fmt.Sprintf("%s (pid %d)", name, pid))
			}
			_ = unix.PidfdSendSignal(pidfd, unix.SIGKILL, nil, 0)
			left = append(left, pid)
		})
		return err == nil && len(left) == 0, err
	})
	return killed, errors.Wrapf(err, "processes %v of the cloud in %s did not die", left, dir)
}

// eachProcess calls fn with each running process of the cloud in dir but
// this one, and a pidfd of it. The pidfd is opened before the process is
// looked at, so that a signal through it reaches the process looked at, or
// none if it exited meanwhile: never another given the same pid.
func eachProcess(dir string, fn func(pid, pidfd int)) error {
	t, err := newTie(dir)
	if err != nil {
		return err
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return errors.Wrap(err, "cannot list processes")
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		fd, err := unix.PidfdOpen(pid, 0)
		if err != nil {
			continue // exited
		}
		if t.holds(pid) {
			fn(pid, fd)
		}
		_ = unix.Close(fd)
	}
	return nil
}

// tie tells the processes of a cloud from every other process: its
// services and whatever they start have the cloud's HOME in their
// environment (RabbitMQ's Erlang helpers, uwsgi's workers, privsep's
// daemons, the DHCP agent's dnsmasq), and libvirt starts QEMU with an
// environment of its own but in libvirtd's mount namespace, the one where
// /run/libvirt is the cloud's <dir>/libvirt/run. Neither a process group
// nor a session holds them all: Erlang's helpers and QEMU run in sessions
// of their own.
type tie struct {
	home []byte
	// libvirtRun is <dir>/libvirt/run, nil if the real compute host never
	// started.
	libvirtRun os.FileInfo
	ownNS      string
	// libvirtd says of each mount namespace looked at whether it is the
	// cloud's libvirtd's.
	libvirtd map[string]bool
}

func newTie(dir string) (*tie, error) {
	ownNS, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		return nil, errors.Wrap(err, "cannot read this process's mount namespace")
	}
	t := &tie{home: []byte("HOME=" + filepath.Join(dir, "home")), ownNS: ownNS, libvirtd: map[string]bool{}}
	if fi, err := os.Stat(filepath.Join(dir, "libvirt", "run")); err == nil {
		t.libvirtRun = fi
	}
	return t, nil
}

// holds reports whether process pid is the cloud's. A process that exited,
// or a zombie, has neither environment nor namespace to read: it is not.
func (t *tie) holds(pid int) bool {
	proc := filepath.Join("/proc", strconv.Itoa(pid))
	env, err := os.ReadFile(filepath.Join(proc, "environ")) //nolint:gosec // /proc
	if err == nil && slices.ContainsFunc(bytes.Split(env, []byte{0}), func(kv []byte) bool { return bytes.Equal(kv, t.home) }) {
		return true
	}
	if t.libvirtRun == nil {
		return false
	}
	ns, err := os.Readlink(filepath.Join(proc, "ns", "mnt"))
	if err != nil || ns == t.ownNS {
		return false
	}
	held, ok := t.libvirtd[ns]
	if !ok {
		// The path resolves in the process's mount namespace.
		fi, err := os.Stat(filepath.Join(proc, "root", "run", "libvirt"))
		held = err == nil && os.SameFile(fi, t.libvirtRun)
		t.libvirtd[ns] = held
	}
	return held
}

// removeNetworks removes the DHCP agent's namespaces (qdhcp-<network>),
// with what still runs there, and the networks' bridges, of networks and
// of those whose state the agent keeps in the cloud's directory dir, and
// names what it removed. The names hold the networks' ids, which only
// this cloud's Neutron gave.
func removeNetworks(dir string, networks []string) []string {
	ids := slices.Clone(networks)
	nets, _ := filepath.Glob(filepath.Join(dir, "state", "neutron", "dhcp", "*"))
	for _, n := range nets {
		if fi, err := os.Stat(n); err == nil && fi.IsDir() {
			ids = append(ids, filepath.Base(n))
		}
	}
	slices.Sort(ids)
	var removed []string
	for _, id := range slices.Compact(ids) {
		ns := "qdhcp-" + id
		if _, err := os.Stat(filepath.Join("/run/netns", ns)); err == nil {
			guesthost.KillNetns(ns)
			if exec.Command("ip", "netns", "delete", ns).Run() == nil { //nolint:gosec // a name of the cloud's
				removed = append(removed, "network namespace "+ns)
			}
		}
		// The bridge Neutron's linuxbridge agent and Nova's os-vif name
		// after the network.
		br := "brq" + id[:min(11, len(id))]
		if _, err := os.Stat(filepath.Join("/sys/class/net", br)); err == nil {
			if exec.Command("ip", "link", "delete", br).Run() == nil { //nolint:gosec // a name of the cloud's
				removed = append(removed, "bridge "+br)
			}
		}
	}
	return removed
}

// detachLoops detaches the loop devices over files in volumes, the
// cloud's volumes directory, and names those it detached.
func detachLoops(volumes string) []string {
	out, err := exec.Command("losetup", "--json", "--list", "--output", "NAME,BACK-FILE").Output()
	if err != nil {
		return nil
	}
	var list struct {
		Devices []struct {
			Name     string `json:"name"`
			BackFile string `json:"back-file"`
		} `json:"loopdevices"`
	}
	if json.Unmarshal(out, &list) != nil {
		return nil
	}
	var detached []string
	for _, d := range list.Devices {
		if strings.HasPrefix(d.BackFile, filepath.Clean(volumes)+"/") && exec.Command("losetup", "-d", d.Name).Run() == nil { //nolint:gosec // a device over the cloud's file
			detached = append(detached, fmt.Sprintf("%s (%s)", d.Name, d.BackFile))
		}
	}
	return detached
}
