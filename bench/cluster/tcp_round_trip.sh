#!/usr/bin/env bash
# The floor under a round trip between two nodes: one byte sent and echoed
# back over a plain TCP socket (TCP_NODELAY) between two network
# namespaces on a bridge, as examples/cluster_bench.rs's nodes are laid
# out, 20,000 times; prints the median and the 10th percentile. Both ends
# are Python, so the figure includes its interpreter's few microseconds
# per call on each side. Needs root and iproute2.
set -euo pipefail
cd "$(dirname "$0")/../.."
prism=true # hosts.sh stops nodes with it; none run here
. bench/cluster/hosts.sh
make_hosts "prt$$" 2 10.81.0
script='
import socket, sys, time
if sys.argv[1] == "serve":
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("10.81.0.1", 7700))
    s.listen(1)
    print("ready", flush=True)
    c, _ = s.accept()
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while True:
        b = c.recv(64)
        if not b:
            break
        c.sendall(b)
else:
    c = socket.create_connection(("10.81.0.1", 7700))
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    times = []
    for _ in range(20000):
        t = time.perf_counter()
        c.sendall(b"x")
        c.recv(64)
        times.append(time.perf_counter() - t)
    times.sort()
    print("TCP round trip between namespaces: median %.1f us, p10 %.1f us"
          % (times[len(times) // 2] * 1e6, times[len(times) // 10] * 1e6))
'
on_host 0 python3 -c "$script" serve >"$HOSTS_TEMP/serve.out" &
server=$!
for _ in $(seq 1 50); do
  grep -q ready "$HOSTS_TEMP/serve.out" 2>/dev/null && break
  sleep 0.1
done
on_host 1 python3 -c "$script" ask
wait "$server"
