#!/bin/busybox sh
# SPDX-License-Identifier: BSD-2-Clause
# /init of the soft-RoCE guest (sim/guest): mount the pseudo file systems, load the modules,
# bring eth0 up with a static address, a permanent neighbour entry for the peer and no IPv6
# (so the guest sends nothing unprompted), create rxe0 and run the agent on /dev/ttyS1.
# Settings come from the kernel command line: rxe.ip=A.B.C.D/N rxe.peer_ip=A.B.C.D
# rxe.peer_mac=xx:xx:xx:xx:xx:xx|none rxe.mtu=N (defaults below).
BB=/bin/busybox
$BB mkdir -p /proc /sys /dev /tmp /run /usr/local/bin
$BB mount -t proc proc /proc
$BB mount -t sysfs sysfs /sys
$BB mount -t devtmpfs devtmpfs /dev
$BB --install -s /usr/local/bin
export PATH=/usr/sbin:/usr/bin:/sbin:/bin:/usr/local/bin HOME=/root
$BB mkdir -p /root
# The agent's port: raw, no echo, from the start (input may arrive before the agent runs).
$BB stty -F /dev/ttyS1 raw -echo
# busybox sh prefers its own applets: name iproute2's tools by path.
IPR=/bin/ip RDMA=/usr/bin/rdma

fail() {
    echo "@@rxe {\"event\": \"fatal\", \"error\": \"$*\"}" > /dev/ttyS1
    echo "rxe-guest: $*" > /dev/console
    $BB poweroff -f
}

ADDR=10.0.0.2/24 PEER_IP=10.0.0.1 PEER_MAC=02:00:00:00:00:01 MTU=9000
for arg in $($BB cat /proc/cmdline); do
    case "$arg" in
        rxe.ip=*) ADDR=${arg#rxe.ip=} ;;
        rxe.peer_ip=*) PEER_IP=${arg#rxe.peer_ip=} ;;
        rxe.peer_mac=*) PEER_MAC=${arg#rxe.peer_mac=} ;;
        rxe.mtu=*) MTU=${arg#rxe.mtu=} ;;
    esac
done

for m in /opt/rxe/modules/*.ko; do
    $BB insmod "$m" || fail "insmod $m failed"
done

for c in all default; do
    echo 1 > /proc/sys/net/ipv6/conf/$c/disable_ipv6
done
# Wait for the virtio NIC (the driver probes asynchronously).
n=0
while [ ! -e /sys/class/net/eth0 ]; do
    n=$((n + 1)); [ $n -gt 100 ] && fail "no eth0"
    $BB usleep 50000
done
echo 1 > /proc/sys/net/ipv6/conf/eth0/disable_ipv6
$IPR link set lo up
$IPR link set eth0 mtu "$MTU" || fail "cannot set MTU $MTU"
$IPR addr add "$ADDR" dev eth0 || fail "bad address $ADDR"
$IPR link set eth0 up
# rxe.peer_mac=none: no entry, the guest learns the peer's MAC by ARP (sim.e2e, the engine's
# own ARP responder).
if [ "$PEER_MAC" != none ]; then
    $IPR neigh replace "$PEER_IP" lladdr "$PEER_MAC" dev eth0 nud permanent || fail "neighbour"
fi
$RDMA link add rxe0 type rxe netdev eth0 || fail "rdma link add rxe0 failed"
$BB dmesg -n 1

/usr/bin/python3 -u /opt/rxe/agent.py /dev/ttyS1 || fail "agent exited with status $?"
$BB poweroff -f
