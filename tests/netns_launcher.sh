#!/bin/sh
# hydra's "ssh" for hosts that are network namespaces on this machine (tests/netns.py).
#
# mpiexec -launcher ssh -launcher-exec tests/netns_launcher.sh calls it as ssh: [options] HOST COMMAND...
# HFR_NETNS_HOSTS maps each host (an address) to its namespace: "10.77.1.1=ns0 10.77.1.2=ns1 ...".
# The command runs under `ip netns exec NS sh -c COMMAND` with this environment (hydra passes the
# ranks' environment itself).
while [ $# -gt 0 ]; do
    case "$1" in
        -*) shift ;;  # ssh options hydra adds (-x)
        *) break ;;
    esac
done
host=$1
shift
ns=
for pair in $HFR_NETNS_HOSTS; do
    if [ "${pair%%=*}" = "$host" ]; then
        ns=${pair#*=}
    fi
done
if [ -z "$ns" ]; then
    echo "netns_launcher.sh: no namespace for host '$host' in HFR_NETNS_HOSTS='$HFR_NETNS_HOSTS'" >&2
    exit 255
fi
exec ip netns exec "$ns" sh -c "$*"
