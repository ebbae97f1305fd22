package guesthost

import (
	"context"
	"net/netip"
	"os/exec"
	"strconv"
	"strings"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
)

// neighbourSuffix ends the name of a host's neighbour's namespace: the
// host's own name and this, so that what a killed run left goes with its
// host (removeLeftovers).
const neighbourSuffix = "nb"

// neighbourLink names both ends of the veth pair that joins a neighbour
// to its host's bridge; each lives in a namespace of its own.
const neighbourLink = "vfnb0"

// AddNeighbour makes a machine on one of the host's guest networks that
// is neither a guest nor the host: a network namespace of its own, joined
// by a veth pair to the bridge that holds gateway in the host's namespace,
// with address addr of the network. It sees the network as a guest does:
// a guest that moved to the other host of a Pair is reached over the
// overlay and answers it there, which the host itself, whose gateway
// address every host of the network holds, cannot see. It returns the
// namespace's path; the host's Stop removes it.
func (h *Host) AddNeighbour(ctx context.Context, gateway netip.Addr, addr netip.Prefix) (string, error) {
	out, err := h.Command(ctx, "ip", "-o", "-4", "addr", "show", "to", gateway.String()+"/32").CombinedOutput()
	f := strings.Fields(string(out))
	if err != nil || len(f) < 2 {
		return "", errors.Errorf("no bridge holds %s in %s: %v: %s", gateway, h.Netns, err, out)
	}
	bridge := f[1]
	mtu, err := h.linkMTU(ctx, bridge)
	if err != nil {
		return "", err
	}
	name := h.Netns + neighbourSuffix
	steps := [][]string{
		{"netns", "add", name},
		{"-n", h.Netns, "link", "add", neighbourLink, "mtu", strconv.Itoa(mtu), "type", "veth", "peer", "name", neighbourLink, "netns", name},
		{"-n", h.Netns, "link", "set", neighbourLink, "master", bridge, "up"},
		{"-n", name, "addr", "add", addr.String(), "dev", neighbourLink},
		{"-n", name, "link", "set", neighbourLink, "up"},
		{"-n", name, "link", "set", "lo", "up"},
	}
	for _, args := range steps {
		if out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput(); err != nil { //nolint:gosec // the harness's own arguments
			return "", errors.Errorf("cannot make the neighbour of %s (ip %v): %v: %s", h.Netns, args, err, out)
		}
	}
	return "/run/netns/" + name, nil
}

// removeNeighbour removes the neighbour of the host whose namespace is
// netns, if it has one; its end of the veth pair goes with it.
func removeNeighbour(netns string) {
	_ = exec.Command("ip", "netns", "del", netns+neighbourSuffix).Run()
}
