#!/usr/bin/env bash
# The stock-kernel check: run the testbed on Debian 12's own kernel (OVS kernel datapath,
# netem, the BPF marker on 6.1) inside QEMU with software emulation, on this machine.
#
#   scripts/stock-kernel.sh [PYTEST ARGS...]     (default: tests/integration)
#
# 1. builds (once; cached in $TESTBED_IMAGE_CACHE keyed on this script's recipe) a Debian 12
#    root filesystem with mmdebstrap: stock linux-image-amd64, Open vSwitch, Mininet,
#    iproute2, the Python packages in a venv; then an ext4 image of it (mke2fs -d, no loop
#    mounts) and its kernel and initrd;
# 2. boots it with QEMU (TCG; KVM does not work on these hosts) with this repository shared
#    over 9p at /project; the image's init (scripts/stock-kernel-boot.sh) runs the project's
#    scripts/stock-kernel-init.sh, which loads the modules, starts OVS and runs pytest,
#    writing the log and exit code into build/stock-kernel/;
# 3. exits with the guest's pytest status.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache_root=${TESTBED_IMAGE_CACHE:-/var/cache/testbed-stock-kernel}
out="$repo/build/stock-kernel"
guest_timeout_s=${TESTBED_GUEST_TIMEOUT_S:-2400}
packages=(linux-image-amd64 kmod udev openvswitch-switch mininet python3-venv python3-pip python3-setuptools
          iproute2 ethtool iputils-ping tcpdump iperf3 procps bpftool)
pip_packages=("os-ken>=4.2,<5" "pyroute2>=0.9" "scapy>=2.5" "PyYAML>=6.0" "pandas>=2.0" "plotly>=5.18" "pytest>=7")

say() { printf '[stock-kernel] %s\n' "$*"; }

if [ "$(id -u)" != 0 ]; then
    echo "stock-kernel.sh: run as root" >&2
    exit 1
fi
for tool in mmdebstrap mke2fs qemu-system-x86_64; do
    if ! command -v "$tool" >/dev/null; then
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -q >/dev/null
        apt-get install -y -q --no-install-recommends mmdebstrap e2fsprogs qemu-system-x86 >/dev/null
        break
    fi
done

# --- 1. image, cached on its recipe -------------------------------------------------------
guest_boot=$(cat "$repo/scripts/stock-kernel-boot.sh")
key=$( { printf '%s\n' "${packages[@]}" "${pip_packages[@]}"; echo "$guest_boot"; } | sha256sum | cut -c1-16)
image="$cache_root/$key"
if [ ! -f "$image/root.ext4" ]; then
    say "building the Debian 12 image $image (a few minutes)"
    rm -rf "$cache_root"/*.tmp
    trap 'rm -rf "$image.tmp"' EXIT
    mkdir -p "$image.tmp/wheels"
    # the host's pip reaches PyPI (and trusts this network's proxy); the chroot installs offline
    python3 -m pip download -q -d "$image.tmp/wheels" "${pip_packages[@]}" >"$image.tmp/pip.log" 2>&1 \
        || { tail -20 "$image.tmp/pip.log" >&2; exit 1; }
    mmdebstrap --variant=important --include="$(IFS=,; echo "${packages[*]}")" \
        --customize-hook='chroot "$1" python3 -m venv --system-site-packages /opt/venv' \
        --customize-hook="copy-in $image.tmp/wheels /tmp" \
        --customize-hook="chroot \"\$1\" /opt/venv/bin/pip install -q --no-index --find-links /tmp/wheels $(printf "'%s' " "${pip_packages[@]}")" \
        --customize-hook='rm -rf "$1/tmp/wheels"' \
        --customize-hook="copy-in $repo/scripts/stock-kernel-boot.sh /usr/local/sbin" \
        --customize-hook='echo testbed-guest > "$1/etc/hostname"' \
        bookworm "$image.tmp/rootfs" >"$image.tmp/mmdebstrap.log" 2>&1 \
        || { tail -20 "$image.tmp/mmdebstrap.log" >&2; exit 1; }
    cp "$image.tmp"/rootfs/boot/vmlinuz-* "$image.tmp/vmlinuz"
    cp "$image.tmp"/rootfs/boot/initrd.img-* "$image.tmp/initrd.img"
    mke2fs -q -t ext4 -d "$image.tmp/rootfs" "$image.tmp/root.ext4" 6G
    rm -rf "$image.tmp/rootfs" "$image.tmp/wheels"
    mv "$image.tmp" "$image"
    trap - EXIT
    for old in "$cache_root"/*; do  # images of older recipes
        [ "$old" = "$image" ] || rm -rf "$old"
    done
fi
if [ ! -f "$repo/build/marker.o" ]; then
    echo "stock-kernel.sh: build/marker.o is missing: run scripts/install.sh first" >&2
    exit 1
fi

# --- 2. boot and run ------------------------------------------------------------------------
rm -rf "$out"
mkdir -p "$out"
# test_training.py is left out by default: its bounds (AllReduce within 5 % of the ideal,
# congestion from line-rate senders) need GPU agents that pace at the emulated line rate,
# and under software CPU emulation they cannot. The default run in test_fabric.py still
# trains in the guest (agents, RoCE, PFC on the kernel datapath), without timing bounds.
# test_report.py is left out for the same reason (its light run must pass the fidelity
# guard, which a TCG guest cannot) and because the guest has no Chromium; every run in the
# guest still writes summary.json and report.html, and test_fabric.py checks them.
# test_labs.py too: every lab's check starts with "the fidelity guard trusted each run".
[ $# -gt 0 ] || set -- tests/integration -v -p no:warnings --ignore=tests/integration/test_training.py \
    --ignore=tests/integration/test_report.py --ignore=tests/integration/test_labs.py
printf '%q ' "$@" > "$out/pytest-args"
disk="$out/root.ext4"
cp --sparse=always "$image/root.ext4" "$disk"   # every run starts from the pristine image
say "booting $(basename "$image"/vmlinuz) under QEMU (TCG); guest log: $out/console.log"
timeout "$guest_timeout_s" qemu-system-x86_64 -machine q35 -accel tcg -cpu max -smp 2 -m 3072 \
    -kernel "$image/vmlinuz" -initrd "$image/initrd.img" \
    -append "root=/dev/vda rw console=ttyS0 panic=-1 init=/usr/local/sbin/stock-kernel-boot.sh" \
    -drive "file=$disk,format=raw,if=virtio" \
    -virtfs "local,path=$repo,mount_tag=project,security_model=none,id=project" \
    -nographic -no-reboot -serial "file:$out/console.log" -monitor none >/dev/null 2>&1 || true
rm -f "$disk"
if [ ! -f "$out/exit-code" ]; then
    say "the guest did not report a result; last console lines:"
    tail -30 "$out/console.log" >&2
    exit 1
fi
tail -5 "$out/pytest.log" || true
exit "$(cat "$out/exit-code")"
