#!/bin/bash
# What the stock-kernel guest does (run by scripts/stock-kernel-boot.sh, PID 1): load the
# modules a stock kernel has, start OVS, run pytest on the shared project and write the
# results to build/stock-kernel/.
mount -t cgroup2 cgroup2 /sys/fs/cgroup 2>/dev/null
hostname testbed-guest
ip link set lo up
for m in openvswitch sch_netem sch_tbf sch_htb sch_ingress cls_bpf veth; do modprobe "$m"; done
out=/project/build/stock-kernel
sysctl -q -w net.core.wmem_default=33554432
/usr/share/openvswitch/scripts/ovs-ctl start --system-id=random > "$out/ovs.log" 2>&1
cd /project
{ uname -a; lsmod | grep -E 'openvswitch|netem'; } > "$out/guest-info.txt" 2>&1
eval "set -- $(cat "$out/pytest-args")"
# under software CPU emulation timers run late: timing-derived bounds are loosened
TESTBED_EXPECT_DATAPATH=kernel TESTBED_TIMING_SLACK=4 PYTHONPATH=/project \
    /opt/venv/bin/python -m pytest -p no:cacheprovider "$@" > "$out/pytest.log" 2>&1
echo $? > "$out/exit-code"
