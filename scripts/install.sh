#!/usr/bin/env bash
# Provision this machine for the testbed; idempotent, installs only what is missing.
# Used by ./lab (quickstart), .ci/run (CI) and the Vagrantfile (lab VM), so it cannot rot.
#   - Debian/Ubuntu packages: Mininet, Open vSwitch, iproute2, ethtool, ping, tcpdump, tshark,
#     iperf3, clang/llvm/libbpf/bpftool (the marker), python3-setuptools (distutils for
#     Mininet on Python >= 3.12), the ssh client (doctor --cluster)
#   - Open vSwitch started (systemd where it runs, else ovs-ctl)
#   - a venv (system site packages, so the distribution's Mininet imports) with the
#     project installed editable; TESTBED_VENV chooses where (default: .venv in the repo)
#   - TESTBED_LINK_PYTHON=1 (the lab VM) makes /usr/local/bin/python start the venv's
#     interpreter so `sudo python -m testbed run` works there
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${TESTBED_VENV:-$repo/.venv}
packages=(mininet openvswitch-switch python3-venv python3-pip python3-setuptools iproute2 ethtool
          iputils-ping tcpdump tshark iperf3 clang llvm libbpf-dev bpftool openssh-client)
# TESTBED_TEST_TOOLS=1 (./lab test): what the test suite needs besides (report.html in headless Chromium;
# sshd for the cluster test's second server, which starts its own: where a policy-rc.d forbids it, as
# in containers, installing does not start a system sshd)
if [ "${TESTBED_TEST_TOOLS:-0}" = 1 ]; then
    packages+=(chromium openssh-server)
fi

say() { printf '[install] %s\n' "$*"; }

if [ "$(id -u)" != 0 ]; then
    echo "install.sh: run as root (it installs packages and starts Open vSwitch)" >&2
    exit 1
fi

missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    say "apt-get install ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >/dev/null
    # Ubuntu ships bpftool in linux-tools-<kernel> rather than a bpftool package
    if [[ " ${missing[*]} " == *" bpftool "* ]] && ! apt-cache show bpftool >/dev/null 2>&1; then
        missing=("${missing[@]/bpftool/linux-tools-common}" "linux-tools-$(uname -r)")
    fi
    apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
fi

# ovs-vswitchd's userspace datapath sends every port's packets through ONE non-blocking
# AF_PACKET socket; packets waiting in a port's qdisc are charged to its send buffer,
# which it takes from net.core.wmem_default when created. At Linux's 208 KiB default,
# OVS silently drops everything beyond ~100 KB queued fabric-wide ("error sending ...:
# Resource temporarily unavailable" in its log). Non-TCP sockets only, memory used on demand.
wmem=$((32 * 1024 * 1024))
if [ "$(sysctl -n net.core.wmem_default)" -lt "$wmem" ]; then
    say "sysctl net.core.wmem_default=$wmem (room for switch queues in OVS's packet socket)"
    sysctl -q -w net.core.wmem_default="$wmem"
fi
vswitchd_sndbuf() {  # empty when ovs-vswitchd is not running (a fresh machine): not an error
    { ss -0 -m -p 2>/dev/null | grep -A1 '"ovs-vswitchd"' | grep -o 'tb[0-9]*' | head -1 | tr -d tb; } || true
}
sndbuf=$(vswitchd_sndbuf)
if [ -n "$sndbuf" ] && [ "$sndbuf" -lt "$wmem" ]; then
    if [ -z "$(ovs-vsctl --timeout=3 list-br 2>/dev/null)" ]; then
        say "restarting ovs-vswitchd so its packet socket gets the larger send buffer"
        if [ -d /run/systemd/system ]; then
            systemctl restart openvswitch-switch
        else
            /usr/share/openvswitch/scripts/ovs-ctl restart --system-id=random >/dev/null
        fi
    else
        say "WARNING: ovs-vswitchd's packet socket has a ${sndbuf}-byte send buffer and bridges exist;"
        say "         restart Open vSwitch when they are gone, or switch queues will lose packets"
    fi
fi

if ! ovs-vsctl --timeout=3 show >/dev/null 2>&1; then
    if [ -d /run/systemd/system ]; then
        say "starting openvswitch-switch (systemd)"
        systemctl start openvswitch-switch
    else
        say "starting Open vSwitch (ovs-ctl)"
        /usr/share/openvswitch/scripts/ovs-ctl start --system-id=random >/dev/null
    fi
    ovs-vsctl --timeout=10 show >/dev/null
fi

if [ ! -x "$venv/bin/python" ]; then
    say "creating venv $venv"
    /usr/bin/python3 -m venv --system-site-packages "$venv"
fi
stamp="$venv/.testbed-installed"
want=$(cat "$repo/setup.cfg" "$repo/pyproject.toml" | sha256sum | cut -d' ' -f1)-$repo
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    say "pip install -e $repo[test]"
    log=$(mktemp)
    if ! "$venv/bin/python" -m pip install -q --disable-pip-version-check -e "$repo[test]" >"$log" 2>&1; then
        cat "$log" >&2
        rm -f "$log"
        exit 1
    fi
    rm -f "$log"
    echo "$want" > "$stamp"
fi

# the ECN/WRED marker: rebuilt when its source is newer than the object
obj="$repo/build/marker.o"
if [ ! -f "$obj" ] || [ "$repo/bpf/marker.c" -nt "$obj" ]; then
    say "clang -target bpf bpf/marker.c -> build/marker.o"
    mkdir -p "$repo/build"
    clang -O2 -g -Wall -target bpf -I"/usr/include/$(uname -m)-linux-gnu" \
        -c "$repo/bpf/marker.c" -o "$obj.tmp"
    mv "$obj.tmp" "$obj"
fi

if [ "${TESTBED_LINK_PYTHON:-0}" = 1 ]; then
    # a wrapper, not a symlink: Python finds its venv (pyvenv.cfg) next to the path it was
    # started by, so through a symlink in /usr/local/bin it would be the bare system Python
    rm -f /usr/local/bin/python
    printf '#!/bin/sh\nexec %q "$@"\n' "$venv/bin/python" > /usr/local/bin/python
    chmod 755 /usr/local/bin/python
fi
say "ready: $venv/bin/python -m testbed doctor"
