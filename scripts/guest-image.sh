#!/usr/bin/env bash
# Build (once) the Debian 12 image the lab-VM check (scripts/lab-vm.sh) makes its box of, and
# print its folder.
#
#   image=$(bash scripts/guest-image.sh)
#
# The folder ($TESTBED_IMAGE_CACHE, keyed on this script and setup.cfg's requirements)
# holds root.ext4 (an ext4 file system, no partition table: the VM boots with libvirt's
# direct kernel boot), vmlinuz and initrd.img, all from Debian 12 with mmdebstrap, no loop mounts:
#   - stock linux-image-amd64, Open vSwitch, Mininet, iproute2 and every Debian package
#     scripts/install.sh installs (so provisioning the lab VM finds them);
#   - /opt/testbed/venv with the Python packages: the venv the Vagrantfile's provisioning
#     (scripts/install.sh) uses, so it finds them and installs only the project (`pip install -e /vagrant[test]`, for real:
#     pip under software emulation takes minutes per package set). Their wheels plus
#     setuptools stay in /var/cache/testbed-wheels with /etc/pip.conf pointing there (no
#     index): the lab VM has no route out;
#   - systemd, sshd, DHCP on the first NIC (systemd-networkd) and a `vagrant` user with
#     Vagrant's insecure public key and passwordless sudo, as Vagrant boxes have.
set -euo pipefail

cache_root=${TESTBED_IMAGE_CACHE:-/var/cache/testbed-lab-vm}
packages=(linux-image-amd64 kmod udev systemd-sysv dbus openssh-server sudo
          openvswitch-switch mininet python3-venv python3-pip python3-setuptools
          iproute2 ethtool iputils-ping tcpdump tshark iperf3 procps clang llvm libbpf-dev bpftool)
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# the project's own requirements (install_requires and the test extra), read from setup.cfg so
# this list cannot fall behind it (it did: protobuf was added there and not here, and the lab
# VM, which has no index, could not install the project)
mapfile -t pip_packages < <(python3 - "$repo/setup.cfg" <<'PY'
import configparser, sys
cfg = configparser.ConfigParser()
cfg.read(sys.argv[1])
for section, key in (("options", "install_requires"), ("options.extras_require", "test")):
    for line in cfg[section][key].splitlines():
        if line.strip():
            print(line.strip())
PY
)
[ "${#pip_packages[@]}" -gt 0 ] || { echo "guest-image.sh: no requirements read from $repo/setup.cfg" >&2; exit 1; }
build_packages=("setuptools>=61" wheel)   # what `pip install -e` builds the project with

say() { printf '[guest-image] %s\n' "$*" >&2; }

if [ "$(id -u)" != 0 ]; then
    echo "guest-image.sh: run as root" >&2
    exit 1
fi
for tool in mmdebstrap mke2fs qemu-system-x86_64 vagrant; do
    if ! command -v "$tool" >/dev/null; then
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -q >/dev/null
        apt-get install -y -q --no-install-recommends mmdebstrap e2fsprogs qemu-system-x86 vagrant >/dev/null
        break
    fi
done

key=$({ cat "${BASH_SOURCE[0]}"; printf '%s\n' "${pip_packages[@]}"; } | sha256sum | cut -c1-16)
image="$cache_root/$key"
if [ -f "$image/root.ext4" ]; then
    echo "$image"
    exit 0
fi

say "building the Debian 12 image $image (a few minutes)"
mkdir -p "$cache_root"
rm -rf "$cache_root"/*.tmp
trap 'rm -rf "$image.tmp"' EXIT
mkdir -p "$image.tmp/wheels"
# the host's pip reaches PyPI (and trusts this network's proxy); the chroot installs offline
python3 -m pip download -q -d "$image.tmp/wheels" "${pip_packages[@]}" "${build_packages[@]}" \
    >"$image.tmp/pip.log" 2>&1 || { tail -20 "$image.tmp/pip.log" >&2; exit 1; }
vagrant_key=$(ls /usr/share/rubygems-integration/all/gems/vagrant-*/keys/vagrant.pub 2>/dev/null | head -1 || true)
[ -n "$vagrant_key" ] || vagrant_key=$(ls /opt/vagrant/embedded/gems/gems/vagrant-*/keys/vagrant.pub | head -1)
cat > "$image.tmp/10-dhcp.network" <<'NET'
[Match]
Name=en* eth*

[Network]
DHCP=ipv4
NET
printf '[global]\nno-index = true\nfind-links = /var/cache/testbed-wheels\n' > "$image.tmp/pip.conf"
mmdebstrap --variant=important --include="$(IFS=,; echo "${packages[*]}")" \
    --customize-hook='chroot "$1" python3 -m venv --system-site-packages /opt/testbed/venv' \
    --customize-hook="copy-in $image.tmp/wheels /var/cache" \
    --customize-hook='mv "$1/var/cache/wheels" "$1/var/cache/testbed-wheels"' \
    --customize-hook="copy-in $image.tmp/pip.conf /etc" \
    --customize-hook="chroot \"\$1\" /opt/testbed/venv/bin/pip install -q --no-index --find-links /var/cache/testbed-wheels $(printf "'%s' " "${pip_packages[@]}")" \
    --customize-hook='echo testbed-lab-vm > "$1/etc/hostname"' \
    --customize-hook="copy-in $image.tmp/10-dhcp.network /etc/systemd/network" \
    --customize-hook='chroot "$1" systemctl enable systemd-networkd ssh' \
    --customize-hook='chroot "$1" useradd --create-home --shell /bin/bash vagrant' \
    --customize-hook='echo "vagrant ALL=(ALL) NOPASSWD: ALL" > "$1/etc/sudoers.d/vagrant"' \
    --customize-hook='echo "UseDNS no" > "$1/etc/ssh/sshd_config.d/vagrant.conf"' \
    --customize-hook="mkdir -p \"\$1/home/vagrant/.ssh\" && cp $vagrant_key \"\$1/home/vagrant/.ssh/authorized_keys\"" \
    --customize-hook='chroot "$1" chown -R vagrant:vagrant /home/vagrant/.ssh' \
    --customize-hook='chmod 700 "$1/home/vagrant/.ssh"' \
    bookworm "$image.tmp/rootfs" >"$image.tmp/mmdebstrap.log" 2>&1 \
    || { tail -20 "$image.tmp/mmdebstrap.log" >&2; exit 1; }
cp "$image.tmp"/rootfs/boot/vmlinuz-* "$image.tmp/vmlinuz"
cp "$image.tmp"/rootfs/boot/initrd.img-* "$image.tmp/initrd.img"
mke2fs -q -t ext4 -d "$image.tmp/rootfs" "$image.tmp/root.ext4" 8G >&2   # stdout is the answer
rm -rf "$image.tmp/rootfs" "$image.tmp/wheels"
mv "$image.tmp" "$image"
trap - EXIT
for old in "$cache_root"/*; do  # images of older recipes
    [ "$old" = "$image" ] || rm -rf "$old"
done
echo "$image"
