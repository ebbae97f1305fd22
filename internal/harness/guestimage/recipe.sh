#!/usr/bin/env bash
# Builds virtfleet's real-guest test image: Debian bookworm with Debian's cloud
# kernel, cloud-init (NoCloud or ConfigDrive), openssh-server, qemu-guest-agent and
# systemd-networkd doing DHCP on any interface, booted by extlinux from one
# ext4 partition, and trimmed to boot fast under TCG (the comments below say
# what each cut saves and why nothing is lost). Usage: recipe.sh WORKDIR OUT.qcow2
# Every line of this file is part of the recipe hash: editing it rebuilds the image.
set -euo pipefail
work=$1
out=$2
size=2G
root=$work/root
disk=$work/disk.raw
mnt=$work/mnt
mkdir -p "$root" "$mnt"

step() { echo "guest-image: $*"; }

step "mmdebstrap bookworm into $root"
# Masked: timers no test guest lives long enough for, cloud-init's config
# stage (see 91-virtfleet-boot.cfg below), and systemd-binfmt, which would
# only register python3's handler for running .pyc files directly. zstd is
# what initramfs-tools compresses with (without it, gzip: slower to unpack).
mmdebstrap --variant=minbase --mode=root --format=directory \
	--include=systemd-sysv,udev,dbus,initramfs-tools,zstd,linux-image-cloud-amd64,cloud-init,openssh-server,qemu-guest-agent,iproute2,netbase,sudo,ca-certificates,util-linux,e2fsprogs,procps \
	--customize-hook='chroot "$1" systemctl enable systemd-networkd.service qemu-guest-agent.service ssh.service' \
	--customize-hook='chroot "$1" systemctl mask e2scrub_reap.service e2scrub_all.timer apt-daily.timer apt-daily-upgrade.timer dpkg-db-backup.timer fstrim.timer man-db.timer cloud-config.service systemd-binfmt.service' \
	bookworm "$root"

step "configure the guest"
cat >"$root/etc/systemd/network/10-dhcp.network" <<'NET'
# DHCP on every Ethernet interface, whatever its name.
[Match]
Type=ether

[Network]
DHCP=yes
NET
cat >"$root/etc/cloud/cloud.cfg.d/90-virtfleet.cfg" <<'CFG'
# networkd above owns the network; the NoCloud seed, or an OpenStack config
# drive (Nova's, label config-2), is the datasource.
network: {config: disabled}
datasource_list: [NoCloud, ConfigDrive, None]
system_info:
  default_user:
    name: debian
    lock_passwd: true
    gecos: Debian
    groups: [adm, sudo]
    sudo: ["ALL=(ALL) NOPASSWD:ALL"]
    shell: /bin/bash
CFG
# A test guest boots under TCG, where every second of work is many: cloud-init
# runs only the modules a VM's seed or config drive uses (hostname, users and
# keys, bootcmd, write_files, mounts for swap, growing the root, runcmd and
# scripts), makes one host key, and leaves the console to the login prompt.
# Each of its stages is a Python process whose imports alone take seconds of
# CPU under TCG: the config stage's two modules run first in the final stage
# instead, and its unit is masked (above).
cat >"$root/etc/cloud/cloud.cfg.d/91-virtfleet-boot.cfg" <<'CFG'
cloud_init_modules: [bootcmd, write-files, growpart, resizefs, mounts, set_hostname, update_hostname, update_etc_hosts, users-groups, ssh]
cloud_config_modules: []
cloud_final_modules: [set-passwords, runcmd, write-files-deferred, scripts-vendor, scripts-per-once, scripts-per-boot, scripts-per-instance, scripts-user, final-message, power-state-change]
ssh_genkeytypes: [ed25519]
ssh:
  emit_keys_to_console: false
no_ssh_fingerprints: true
CFG
# A vCPU added to the running guest comes online at once, as on distributions
# that ship this rule (Debian's udev does not): live resize adds vCPUs.
mkdir -p "$root/etc/udev/rules.d"
cat >"$root/etc/udev/rules.d/80-virtfleet-cpu-hotplug.rules" <<'RULES'
SUBSYSTEM=="cpu", ACTION=="add", TEST=="online", ATTR{online}=="0", ATTR{online}="1"
RULES
# The initramfs has only to mount the root: the drivers of a virtio disk
# (blk or scsi), and of the IDE CD-ROM Nova puts a config drive on, which
# ds-identify looks for before the root's udev loads any driver. Debian's
# default ("most") packs some 170 modules into a 50 MB archive the kernel
# unpacks at every boot, and loads every one a device matches: under TCG,
# seconds of CPU. No swap holds a hibernated system to resume.
cat >"$root/etc/initramfs-tools/conf.d/virtfleet.conf" <<'CONF'
MODULES=list
RESUME=none
CONF
printf '%s\n' virtio_pci virtio_blk virtio_scsi sd_mod ata_piix sr_mod >>"$root/etc/initramfs-tools/modules"
chroot "$root" update-initramfs -u -k all
# QEMU's default CPU offers AMD's SVM, so udev would load kvm at every boot
# of a guest that runs no guests of its own; a nested hypervisor still loads
# it by name (blacklist stops only the load by device alias).
cat >"$root/etc/modprobe.d/virtfleet-guest.conf" <<'CONF'
blacklist kvm_amd
blacklist kvm_intel
CONF
# No fsck at boot: ext4 replays its journal at mount, and a check costs a
# guest under TCG many seconds.
echo 'LABEL=root / ext4 defaults,errors=remount-ro 0 0' >"$root/etc/fstab"
rm -f "$root/etc/hostname" "$root/etc/ssh/ssh_host_"*
: >"$root/etc/machine-id"
rm -f "$root/var/lib/dbus/machine-id"
# The serial console is the one a test can read (virsh console, QEMU log).
# tsc=reliable: QEMU's TSC is one clock for every vCPU, but a guest with a
# hot-pluggable vCPU and no invariant-TSC flag (QEMU's default CPU) would
# take it for unsynchronized and read the time from the HPET instead: under
# TCG every read is an emulated device access, and clock_gettime in user
# space a system call rather than the vDSO's.
# no_timer_check: at boot the kernel checks that the PIT's interrupt
# arrives within a short busy loop and panics ("IO-APIC + timer doesn't
# work!") when it does not; a TCG guest on a loaded host can miss that
# window (seen after a stop and start in CI), though its timer works.
mkdir -p "$root/boot/extlinux"
kernel=$(cd "$root/boot" && ls vmlinuz-* | sort -V | tail -1)
initrd=$(cd "$root/boot" && ls initrd.img-* | sort -V | tail -1)
cat >"$root/boot/extlinux/extlinux.conf" <<CONF
DEFAULT linux
TIMEOUT 1
PROMPT 0
LABEL linux
  KERNEL /boot/$kernel
  INITRD /boot/$initrd
  APPEND root=LABEL=root ro console=tty0 console=ttyS0,115200n8 quiet tsc=reliable no_timer_check
CONF
rm -rf "$root/var/cache/apt/archives/"*.deb "$root/var/lib/apt/lists/"*

step "make the disk: one bootable ext4 partition from 1 MiB"
rm -f "$disk"
truncate -s "$size" "$disk"
echo 'start=2048, type=83, bootable' | sfdisk -q "$disk"
offset=$((2048 * 512))
sectors=$(( $(stat -c %s "$disk") / 512 - 2048 ))
loop=$(losetup --find --show --offset "$offset" --sizelimit $((sectors * 512)) "$disk")
cleanup() {
	umount "$mnt" 2>/dev/null || true
	losetup -d "$loop" 2>/dev/null || true
}
trap cleanup EXIT
# syslinux reads neither 64-bit block numbers nor the newer checksum-seed and orphan-file features.
mkfs.ext4 -q -L root -O ^64bit,^metadata_csum_seed,^orphan_file -d "$root" "$loop"
mount "$loop" "$mnt"
extlinux --install "$mnt/boot/extlinux"
umount "$mnt"
losetup -d "$loop"
trap - EXIT
dd if=/usr/lib/EXTLINUX/mbr.bin of="$disk" bs=440 count=1 conv=notrunc status=none

step "convert to qcow2"
qemu-img convert -f raw -O qcow2 "$disk" "$out"
rm -f "$disk"
