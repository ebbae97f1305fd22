package kubenode

import (
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
)

// cgroupRoot is where the machine mounts its cgroup hierarchies.
const cgroupRoot = "/sys/fs/cgroup"

// unified reports whether the machine has cgroup v2 alone: one hierarchy,
// mounted at cgroupRoot.
func unified() bool {
	_, err := os.Stat(filepath.Join(cgroupRoot, "cgroup.controllers"))
	return err == nil
}

// hierarchies are the mounted cgroup hierarchies the kubelet puts pods in:
// under cgroup v1 each controller's, systemd's named one and, on a hybrid
// machine, the v2 one at unified.
func hierarchies() ([]string, error) {
	if unified() {
		return []string{cgroupRoot}, nil
	}
	entries, err := os.ReadDir(cgroupRoot)
	if err != nil {
		return nil, errors.Wrap(err, "cannot list the cgroup hierarchies")
	}
	var out []string
	for _, e := range entries {
		p := filepath.Join(cgroupRoot, e.Name())
		if !e.IsDir() {
			continue
		}
		if _, err := os.Stat(filepath.Join(p, "cgroup.procs")); err == nil {
			out = append(out, p)
		}
	}
	return out, nil
}

// trackingHierarchy is the hierarchy whose cgroups hold every process of a
// node: the pids controller's under cgroup v1.
func trackingHierarchy() string {
	if unified() {
		return cgroupRoot
	}
	return filepath.Join(cgroupRoot, "pids")
}

// makeCgroups makes cgroup name in every hierarchy, the kubelet's
// cgroupRoot, and a child node in the tracking hierarchy for the node's
// own processes, and returns the path of that child's cgroup.procs.
func makeCgroups(name string) (string, error) {
	hs, err := hierarchies()
	if err != nil {
		return "", err
	}
	for _, h := range hs {
		dir := filepath.Join(h, name)
		if err := os.Mkdir(dir, 0o755); err != nil {
			return "", errors.Wrapf(err, "cannot make cgroup %s", dir)
		}
		// A v1 cpuset cgroup starts with no CPU and no memory node, and
		// takes no process until given some: its parent's.
		if filepath.Base(h) == "cpuset" {
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				b, err := os.ReadFile(filepath.Join(h, f)) //nolint:gosec // cgroupfs
				if err == nil {
					err = os.WriteFile(filepath.Join(dir, f), b, 0o644) //nolint:gosec // cgroupfs
				}
				if err != nil {
					return "", errors.Wrapf(err, "cannot give cgroup %s its parent's %s", dir, f)
				}
			}
		}
	}
	node := filepath.Join(trackingHierarchy(), name, "node")
	if err := os.Mkdir(node, 0o755); err != nil {
		return "", errors.Wrapf(err, "cannot make cgroup %s", node)
	}
	return filepath.Join(node, "cgroup.procs"), nil
}

// removeCgroups removes cgroup name and its children, deepest first, from
// every hierarchy: once their processes are gone, as removal needs.
func removeCgroups(name string) error {
	hs, err := hierarchies()
	if err != nil {
		return err
	}
	var errs []error
	for _, h := range hs {
		var dirs []string
		_ = filepath.WalkDir(filepath.Join(h, name), func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		sort.Slice(dirs, func(i, j int) bool { return strings.Count(dirs[i], "/") > strings.Count(dirs[j], "/") })
		for _, d := range dirs {
			if err := os.Remove(d); err != nil && !os.IsNotExist(err) {
				errs = append(errs, err)
			}
		}
	}
	return errors.Wrapf(errors.Join(errs...), "cannot remove cgroup %s", name)
}
