#!/usr/bin/env bash
# How long `prism start --head` takes to return with a head that answers
# (control store up, raylet registered, record written), and `prism stop`
# to stop it: RUNS runs each, in a temp dir of their own, with min, median
# and max. Usage: bench/cluster/start.sh [RUNS]  (default 10)
set -euo pipefail
cd "$(dirname "$0")/../.."
runs="${1:-10}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/prism/target}"
cargo build -q --release -p prism-cli --bin prism
prism="$CARGO_TARGET_DIR/release/prism"
temp="$(mktemp -d /tmp/prism-bench-start.XXXXXX)"
trap '"$prism" stop --force --temp-dir "$temp" >/dev/null 2>&1 || true; rm -rf "$temp"' EXIT
port=$((20000 + RANDOM % 20000))
starts=()
stops=()
for _ in $(seq "$runs"); do
  t0=$(date +%s%N)
  "$prism" start --head --port "$port" --node-ip-address 127.0.0.1 --num-cpus 1 --temp-dir "$temp" >/dev/null
  t1=$(date +%s%N)
  "$prism" stop --temp-dir "$temp" >/dev/null
  t2=$(date +%s%N)
  starts+=($(((t1 - t0) / 1000)))
  stops+=($(((t2 - t1) / 1000)))
done
summary() {
  sort -n | awk '{ v[NR] = $1 } END { printf "min %.1f ms, median %.1f ms, max %.1f ms\n", v[1] / 1000, v[int((NR + 1) / 2)] / 1000, v[NR] / 1000 }'
}
echo "prism start --head ($runs runs): $(printf '%s\n' "${starts[@]}" | summary)"
echo "prism stop         ($runs runs): $(printf '%s\n' "${stops[@]}" | summary)"
