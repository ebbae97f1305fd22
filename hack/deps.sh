#!/usr/bin/env bash
# Installs the Debian packages virtfleet needs, for what is asked (any of, in
# any order; none means test):
#   run         make run: libvirtd (its test driver simulates hypervisor
#               nodes) and its clients;
#   guests      make run GUESTS=qemu and the real-guest suite (test/guest):
#               QEMU, dnsmasq and iptables for libvirt's NAT network, iproute2
#               for its network namespace, openssh-client to reach the guest,
#               and what builds the guest image (mmdebstrap, fdisk, e2fsprogs,
#               extlinux, qemu-utils);
#   crossplane  make run CROSSPLANE=1: Crossplane core, a Go build;
#   kubenode    the tests that run a real Kubernetes node
#               (internal/harness/kubenode): containerd, runc, the CNI
#               plugins and iptables for kube-proxy, and the kubelet,
#               kube-proxy, scheduler, controller manager and CoreDNS, a Go
#               build;
#   test        make test: all of the above, Debian's own OpenStack Zed
#               services (Keystone, Placement, Nova, Glance, Cinder, Neutron
#               with MariaDB and RabbitMQ) that the Nova backend is tested
#               against as plain processes (internal/harness/openstack):
#               Glance holds the images the backend imports, which Cinder
#               writes into volumes (qemu-img, from qemu-utils, a
#               dependency of cinder-volume), and a real nova-compute with
#               Neutron's linuxbridge and DHCP agents boots the guest image
#               from one; and Prometheus's promtool,
#               which checks the alert rules.
# Run as root it installs what is missing; otherwise it prints the exact
# command to run. The once-per-machine Go builds the profiles need build
# beside apt (see below).
set -euo pipefail

profiles=("$@")
if [ ${#profiles[@]} -eq 0 ]; then profiles=(test); fi

run=(libvirt-daemon-system libvirt-clients util-linux)
guests=(qemu-system-x86 qemu-utils dnsmasq-base iptables iproute2 openssh-client
	mmdebstrap fdisk e2fsprogs mount extlinux)
# nova-compute is left out on purpose: it pulls libvirt and QEMU for its own
# service; the harness runs nova.cmd.compute from python3-nova with Nova's
# fake.FakeDriver, and, for the tests that boot a real guest, with its
# libvirt driver on a libvirtd of the harness's own (libvirt and QEMU are in
# run and guests). That real compute host needs python3-libvirt (the libvirt
# driver's binding), genisoimage (Nova's config drive, which gives the
# guest its key), and Neutron's linuxbridge and DHCP agents (the guests'
# bridge, and dnsmasq in the network's namespace; they bring ebtables,
# whose rules the linuxbridge agent only lists on the harness's networks,
# made without port security, and dnsmasq-utils).
openstack=(mariadb-server python3-pymysql rabbitmq-server
	keystone placement-api
	nova-api nova-conductor nova-scheduler python3-nova
	glance-api
	cinder-api cinder-scheduler cinder-volume
	neutron-server uwsgi-plugin-python3
	python3-libvirt genisoimage neutron-linuxbridge-agent neutron-dhcp-agent)
monitoring=(prometheus)
kubenode=(containerd runc containernetworking-plugins iptables)

# envtest's binaries serve every profile; Crossplane core only some.
packages=()
builds=(envtest-assets)
for p in "${profiles[@]}"; do
	case "$p" in
	run) packages+=("${run[@]}") ;;
	guests) packages+=("${run[@]}" "${guests[@]}") ;;
	crossplane) builds+=(crossplane-core) ;;
	kubenode)
		packages+=("${kubenode[@]}")
		builds+=(kube-node)
		;;
	test)
		packages+=("${run[@]}" "${guests[@]}" "${openstack[@]}" "${monitoring[@]}" "${kubenode[@]}")
		builds+=(crossplane-core kube-node)
		;;
	*)
		echo "deps: unknown profile $p (run, guests, crossplane, kubenode or test)" >&2
		exit 2
		;;
	esac
done

declare -A seen=()
missing=()
for p in "${packages[@]}"; do
	if [ -n "${seen[$p]:-}" ]; then continue; fi
	seen[$p]=1
	if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
		missing+=("$p")
	fi
done

if [ ${#missing[@]} -eq 0 ]; then
	echo "deps: the Debian packages of ${profiles[*]} are installed"
	exit 0
fi

install=(apt-get install -y --no-install-recommends "${missing[@]}")
if [ "$(id -u)" -ne 0 ]; then
	echo "deps: missing Debian packages: ${missing[*]}" >&2
	echo "deps: run as root:  apt-get update && ${install[*]}" >&2
	exit 1
fi

# The OpenStack packages would ask for a database, a RabbitMQ user and
# Keystone endpoints to configure; the test harness makes private ones of
# each, so every such question is answered "no".
{
	for p in keystone placement-api nova-common glance-common cinder-common neutron-common; do
		echo "$p $p/configure_db boolean false"
		echo "$p $p/dbconfig-install boolean false"
		echo "$p $p/dbconfig-upgrade boolean false"
		echo "$p $p/dbconfig-remove boolean false"
		echo "$p $p/configure_rabbit boolean false"
		echo "$p $p/configure_ksat boolean false"
	done
	for p in keystone placement-api nova-api glance-api cinder-api neutron-server; do
		echo "$p $p/register-endpoint boolean false"
	done
	echo "keystone keystone/create-admin-tenant boolean false"
	echo "keystone keystone/admin-password password"
	echo "dbconfig-common dbconfig-common/dbconfig-install boolean false"
} | debconf-set-selections

# No service of any package may start at install: the harness runs private
# instances, and the machine's shared by others. policy-rc.d is the Debian
# way to say so to invoke-rc.d; a pre-existing one is left as it is.
policy=/usr/sbin/policy-rc.d
own_policy=
building=
cleanup() {
	if [ -n "$own_policy" ]; then rm -f "$policy"; fi
	if [ -n "$building" ]; then kill -- -"$building" 2>/dev/null || true; fi
}
trap cleanup EXIT
if [ ! -e "$policy" ]; then
	printf '#!/bin/sh\nexit 101\n' >"$policy"
	chmod 755 "$policy"
	own_policy=1
fi

# A machine that lacks the packages lacks the once-per-machine Go builds
# too. Those the profiles need and that need no Debian package (envtest's
# binaries, Crossplane core; see the Makefile's caches) build beside apt,
# which spends most of its time downloading and unpacking: a fresh machine
# then pays for the longer of the two instead of their sum. They are waited
# for, so nothing of deps outlives it. VIRTFLEET_DEPS_BUILDS=0 skips them.
if [ "${VIRTFLEET_DEPS_BUILDS:-1}" != 0 ] && command -v "${GO:-go}" >/dev/null; then
	echo "deps: building ${builds[*]} beside apt"
	# In a process group of its own, so that a failed apt stops it whole.
	setsid make --no-print-directory -C "$(dirname "$0")/.." -j${#builds[@]} "${builds[@]}" &
	building=$!
fi

echo "deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
"${install[@]}"
if [ -n "$building" ]; then
	pid=$building
	building=
	wait "$pid"
fi
