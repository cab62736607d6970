#!/bin/bash
# PID 1 of the stock-kernel guest, baked into the image (scripts/stock-kernel.sh): mount the
# basics and the project shared over 9p, then run the project's own guest script, so that
# changing what the guest does never needs a new image.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
mkdir -p /dev/pts /run /tmp; mount -t devpts devpts /dev/pts; mount -t tmpfs tmpfs /run; mount -t tmpfs tmpfs /tmp
modprobe 9p; modprobe 9pnet_virtio
mkdir -p /project && mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 project /project
bash /project/scripts/stock-kernel-init.sh
sync
umount /project
echo o > /proc/sysrq-trigger
