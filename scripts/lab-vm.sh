#!/usr/bin/env bash
# The lab-VM check: boot the project's real Vagrantfile with vagrant-libvirt on QEMU
# (software emulation: KVM does not work on these hosts) from a box built here, and do in it
# what the README tells a trainee to do.
#
#   scripts/lab-vm.sh [PYTEST ARGS...]     (./lab test-vagrant; default: tests/integration
#                                            minus the files that need a trusted fidelity guard)
#
# 1. builds (once, cached next to the image) a libvirt box from scripts/guest-image.sh's
#    Debian 12 image: box.img (qcow2), the image's kernel and initrd, metadata.json and a
#    Vagrantfile that boots that kernel (the image has no partition table or boot loader);
# 2. runs scripts/lab-vm-inside.sh in new mount, network and PID namespaces: a libvirtd of
#    its own (this machine's libvirt is never touched: its config, state, socket and the
#    VM's NAT network are private), `vagrant box add`, `vagrant up --provider=libvirt`,
#    the README's `vagrant ssh -c 'cd /vagrant && sudo python -m testbed run'`, one lab
#    (`lab run` + `lab check`), the integration tests on the VM's stock kernel, then
#    `vagrant destroy -f`. When that process ends, the kernel ends every process left in
#    its PID namespace, so nothing outlives the check;
# 3. exits non-zero if any step failed. Logs and the VM's results: build/lab-vm/.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
work="$repo/build/lab-vm"
say() { printf '[lab-vm] %s\n' "$*"; }

if [ "$(id -u)" != 0 ]; then
    echo "lab-vm.sh: run as root" >&2
    exit 1
fi
# The VM mounts this checkout at /vagrant over 9p, where the VM's unprivileged vagrant user
# gets the host's permission bits: a checkout others cannot read and enter (a `mktemp -d`
# folder is 0700) fails every VM step later with "cd: /vagrant: Permission denied".
if ! setpriv --reuid=nobody --regid=nogroup --clear-groups test -r "$repo" -a -x "$repo"; then
    blocked=$repo
    d=$repo
    while [ "$d" != / ]; do
        setpriv --reuid=nobody --regid=nogroup --clear-groups test -x "$d" || blocked=$d
        d=$(dirname "$d")
    done
    echo "lab-vm.sh: $repo must be readable and searchable by other users: the VM's vagrant user" \
        "reads it over 9p; $blocked is mode $(stat -c %a "$blocked") (try: chmod o+rx $blocked)" >&2
    exit 1
fi

host_packages=(vagrant vagrant-libvirt libvirt-daemon-system dnsmasq-base iptables qemu-system-x86 qemu-utils)
missing=()
for p in "${host_packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    say "apt-get install ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >/dev/null
    apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
fi

# --- 1. the box -------------------------------------------------------------------------------
image=$(bash "$repo/scripts/guest-image.sh")
box="$image/testbed-libvirt.box"
if [ ! -f "$box" ]; then
    say "building the libvirt box $box"
    tmp="$image/box.tmp"
    rm -rf "$tmp" && mkdir -p "$tmp"
    qemu-img convert -O qcow2 "$image/root.ext4" "$tmp/box.img"
    cp "$image/vmlinuz" "$image/initrd.img" "$tmp/"
    size_gb=$(( ($(stat -c %s "$image/root.ext4") + (1 << 30) - 1) >> 30 ))
    printf '{"provider": "libvirt", "format": "qcow2", "virtual_size": %d}\n' "$size_gb" > "$tmp/metadata.json"
    cat > "$tmp/Vagrantfile" <<'BOX'
# Box: Debian 12 with its stock kernel, built by the testbed's scripts/guest-image.sh. The
# disk is one ext4 file system without a boot loader, so libvirt boots the box's kernel.
Vagrant.configure("2") do |config|
  config.vm.provider "libvirt" do |lv|
    lv.kernel = File.join(__dir__, "vmlinuz")
    lv.initrd = File.join(__dir__, "initrd.img")
    lv.cmd_line = "root=/dev/vda rw console=ttyS0 net.ifnames=0"
  end
end
BOX
    tar -C "$tmp" -cf "$box.tmp" metadata.json Vagrantfile vmlinuz initrd.img box.img
    mv "$box.tmp" "$box"
    rm -rf "$tmp"
fi

# --- 2. the VM, in namespaces of its own ----------------------------------------------------------
rm -rf "$work"
mkdir -p "$work"
say "booting the lab VM (vagrant-libvirt, QEMU without KVM); logs in $work"
# unshare ignores SIGINT and SIGTERM while it waits: pass them on to the inside (PID 1 of its
# namespace, whose trap destroys the VM); should unshare itself die, its child gets SIGKILL
unshare --mount --net --pid --fork --kill-child --mount-proc --propagation private \
    bash "$repo/scripts/lab-vm-inside.sh" "$box" "$@" &
unshare_pid=$!
forward() { kill -"$1" $(ps -o pid= --ppid "$unshare_pid") 2>/dev/null || true; }
trap 'forward TERM' TERM
trap 'forward INT' INT
rc=0
while :; do
    wait "$unshare_pid" && rc=0 || rc=$?
    kill -0 "$unshare_pid" 2>/dev/null || break   # a trapped signal interrupted the wait: wait again
done
# the VM's disks (gigabytes) go; logs and results stay
rm -rf "$work/var-lib-libvirt" "$work/vagrant.d" "$work/etc-libvirt"
exit "$rc"
