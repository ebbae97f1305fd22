#!/usr/bin/env bash
# Installs the Debian packages virtfleet needs to run and test: libvirtd (its
# test driver simulates hypervisor nodes) and its clients; for the real-guest
# suite (test/guest) QEMU, dnsmasq and iptables for libvirt's NAT network,
# iproute2 for its network namespace, openssh-client to reach the guest, and
# what builds the guest image (mmdebstrap, fdisk, e2fsprogs, extlinux,
# qemu-utils). Run as root it installs what is missing; otherwise it prints
# the exact command to run.
set -euo pipefail

packages=(libvirt-daemon-system libvirt-clients util-linux
	qemu-system-x86 qemu-utils dnsmasq-base iptables iproute2 openssh-client
	mmdebstrap fdisk e2fsprogs mount extlinux)

missing=()
for p in "${packages[@]}"; do
	if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
		missing+=("$p")
	fi
done

if [ ${#missing[@]} -eq 0 ]; then
	echo "deps: ${packages[*]} installed"
	exit 0
fi

install=(apt-get install -y --no-install-recommends "${missing[@]}")
if [ "$(id -u)" -ne 0 ]; then
	echo "deps: missing Debian packages: ${missing[*]}" >&2
	echo "deps: run as root:  apt-get update && ${install[*]}" >&2
	exit 1
fi

echo "deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
"${install[@]}"
