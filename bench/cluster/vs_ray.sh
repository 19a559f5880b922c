#!/usr/bin/env bash
# Prism against Ray across three nodes, in one run.
#
# Prism: three nodes of one CPU each, in network namespaces of their own on
# a bridge (10.79.0.1 the head, .2 and .3), started with the `prism`
# command; examples/cluster_bench.rs runs on the head.
# Ray: ray.cluster_utils.Cluster with three nodes of one CPU each on this
# machine, the driver on the head (bench/cluster/ray_side.py), from a venv
# with ray 2.60.0 (PRISM_RAY_PY, else the one bench/ray/setup_train.sh or
# bench/ray/setup.sh makes).
#
# Needs root and iproute2. Everything made is removed at the end. Prints
# every row for both, and how many times faster Prism is.
set -euo pipefail
cd "$(dirname "$0")/../.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/prism/target}"
cargo build -q --release -p prism-cli --bin prism
cargo build -q --release -p prism-examples --example cluster_bench

ray_py="${PRISM_RAY_PY:-}"
if [[ -z "$ray_py" ]]; then
  for candidate in "$HOME/.cache/prism/ray-train-2.60.0/bin/python" bench/ray/.venv/bin/python; do
    if [[ -x "$candidate" ]] && "$candidate" -c 'import ray, numpy' 2>/dev/null; then
      ray_py="$candidate"
      break
    fi
  done
fi
if [[ -z "$ray_py" ]]; then
  bash bench/ray/setup.sh
  ray_py=bench/ray/.venv/bin/python
fi

prism="$CARGO_TARGET_DIR/release/prism"
. bench/cluster/hosts.sh
make_hosts "pvr$$" 3 10.79.0
temp="$HOSTS_TEMP"

now_ms() { date +%s%3N; }
t0=$(now_ms)
on_host 0 "$prism" start --head --port 6380 --node-ip-address 10.79.0.1 \
  --num-cpus 1 --temp-dir "$temp/h0" >/dev/null
token="$(cat "$temp/h0/token")"
for h in 1 2; do
  on_host "$h" "$prism" start --address 10.79.0.1:6380 \
    --node-ip-address "10.79.0.$((h + 1))" --num-cpus 1 --temp-dir "$temp/h$h" \
    --token "$token" >/dev/null
done
t1=$(now_ms)
prism_rows="$temp/prism.rows"
echo "ROW 3 nodes started $((t1 - t0)) ms" >"$prism_rows"
# One heartbeat later every raylet has the others in its view.
sleep 1.5
on_host 0 env PRISM_ADDRESS=10.79.0.1:6380 PRISM_TEMP_DIR="$temp/h0" \
  "$CARGO_TARGET_DIR/release/examples/cluster_bench" | grep '^ROW' >>"$prism_rows"
t2=$(now_ms)
for h in 0 1 2; do
  on_host "$h" "$prism" stop --temp-dir "$temp/h$h" >/dev/null
done
echo "ROW 3 nodes stopped $(($(now_ms) - t2)) ms" >>"$prism_rows"

ray_rows="$temp/ray.rows"
RAY_DISABLE_USAGE_STATS=1 "$ray_py" bench/cluster/ray_side.py 2>"$temp/ray.err" | grep '^ROW' >"$ray_rows" || {
  cat "$temp/ray.err" >&2
  exit 1
}

python3 bench/cluster/rows.py "$prism_rows" "$ray_rows" Prism "Ray 2.60" "Prism's advantage"
