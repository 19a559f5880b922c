#!/usr/bin/env bash
# The driver's memory with N tasks queued and none running: a head that
# offers no CPUs, in a cluster that waits for nodes to join
# (PRISM_INFEASIBLE_WAIT_MS), and examples/envelope.rs submitting N no-op
# SPREAD tasks of one CPU each. Once the driver's RSS holds still for 3 s
# (at most 300 s), prints its RSS and peak RSS, then stops everything.
#
# Usage: BIN=<folder with prism and envelope> bash bench/envelope/queued_memory.sh [N]
# (N: 200000 by default). Build them with `cargo build --release -p
# prism-cli --bin prism -p prism-examples --example envelope`.
set -uo pipefail
n="${1:-200000}"
: "${BIN:?set BIN to a folder holding prism and envelope}"
dir="$(mktemp -d /tmp/prism-queued.XXXXXX)"
port="${PORT:-6398}"
driver=
cleanup() {
  [ -n "$driver" ] && kill "$driver" 2>/dev/null && wait "$driver" 2>/dev/null
  "$BIN/prism" stop --temp-dir "$dir/head" >/dev/null 2>&1
  rm -rf "$dir"
}
trap cleanup EXIT
PRISM_INFEASIBLE_WAIT_MS=600000 "$BIN/prism" start --head --port "$port" --num-cpus 0 \
  --include-dashboard false --temp-dir "$dir/head" >"$dir/head.out" 2>&1 || { cat "$dir/head.out"; exit 1; }
head_pid=$(pgrep -f "temp-dir $dir/head" | head -1)
PRISM_ADDRESS="127.0.0.1:$port" PRISM_TEMP_DIR="$dir/head" "$BIN/envelope" --actors 0 --groups 0 \
  --tasks "$n" --head-pids "$head_pid" >"$dir/driver.out" 2>&1 &
driver=$!
kib() { grep "^$1:" "/proc/$driver/status" 2>/dev/null | tr -dc 0-9; }
last=0 same=0 started=$(date +%s)
for _ in $(seq 1 300); do
  sleep 1
  rss=$(kib VmRSS)
  [ -n "$rss" ] || { echo "the driver ended:"; cat "$dir/driver.out"; exit 1; }
  if [ "$rss" = "$last" ]; then same=$((same + 1)); else same=0; fi
  last=$rss
  [ "$same" -ge 3 ] && break
done
echo "$n tasks queued: driver RSS $(( $(kib VmRSS) / 1024 )) MiB, peak $(( $(kib VmHWM) / 1024 )) MiB ($(( $(kib VmRSS) * 1024 / n )) bytes a task; held still after $(( $(date +%s) - started )) s)"
