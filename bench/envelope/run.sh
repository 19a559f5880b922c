#!/usr/bin/env bash
# The head's scalability envelope on this machine (issue 42, item 2), as
# Ray's release/benchmarks/README.md publishes one: for each cluster size N
# (default 50 100 200) it starts a head and N node processes on 127.0.0.1,
# each with its own --temp-dir, and measures
#   - joining: how long the N nodes take to register (started in batches);
#   - idle: the head's CPU (control store + head raylet, from /proc) and
#     memory (RSS, PSS) with N nodes heartbeating, and each node's;
#   - `prism status`: median of 5 runs;
#   - death detection: one node SIGKILLed, time until `prism status`
#     shows it DEAD (PRISM_NODE_DEATH_TIMEOUT_MS, 5 s by default);
#   - the driver examples/envelope.rs: ACTORS actors created and called,
#     PGS placement groups created and removed, TASKS no-op tasks
#     queued with SPREAD, each with the head's CPU and memory.
# Then prints one table, a column per N.
#
# Usage: bench/envelope/run.sh [N ...]
# Environment: ACTORS (2000), PGS (placement groups, 1000), TASKS (10000,100000: a list),
# NODE_CPUS (4: CPUs each node declares), BATCH (25: nodes started at once),
# BIN (a folder holding `prism` and `envelope` built before: used as they
# are, nothing is built; to compare two trees' builds, alternating).
# Nodes start no workers until work lands on them (workers are started per
# job, on a node the job's work reaches), and keep no warm object store
# (PRISM_OBJECT_STORE_WARM_BYTES=0, a 64 MiB store each).
set -euo pipefail
cd "$(dirname "$0")/../.."

sizes=("$@")
[ ${#sizes[@]} -gt 0 ] || sizes=(50 100 200)
actors="${ACTORS:-2000}"
groups="${PGS:-1000}" # not GROUPS: bash sets that one
tasks="${TASKS:-10000,100000}"
node_cpus="${NODE_CPUS:-4}"
batch="${BATCH:-25}"

if [ -n "${BIN:-}" ]; then
  prism="$BIN/prism"
  envelope="$BIN/envelope"
else
  export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/prism/target}"
  export CARGO_INCREMENTAL=0
  cargo build --release -p prism-cli --bin prism
  cargo build --release -p prism-examples --example envelope
  prism="$CARGO_TARGET_DIR/release/prism"
  envelope="$CARGO_TARGET_DIR/release/examples/envelope"
fi

work="$(mktemp -d /tmp/prism-envelope.XXXXXX)"
started=() # every process this script started, head first

# Stops every process in `started` (and what they started) by pid:
# SIGTERM (nodes leave the cluster), up to 20 s, then SIGKILL.
stop_all() {
  local p kids=()
  for p in "${started[@]}"; do
    kids+=($(pgrep -P "$p" 2>/dev/null || true))
  done
  for ((i = ${#started[@]} - 1; i >= 0; i--)); do
    kill -TERM "${started[i]}" 2>/dev/null || true
  done
  for _ in $(seq 200); do
    local left=0
    for p in "${started[@]}" "${kids[@]}"; do
      kill -0 "$p" 2>/dev/null && left=1 && break
    done
    [ "$left" = 0 ] && break
    sleep 0.1
  done
  for p in "${started[@]}" "${kids[@]}"; do
    kill -KILL "$p" 2>/dev/null || true
  done
  started=()
}
cleanup() {
  stop_all
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

now_ms() { echo $(($(date +%s%N) / 1000000)); }
# CPU ticks (user + system) of the given pids, summed.
ticks() {
  local p sum=0 f
  for p in "$@"; do
    f=$(sed 's/.*) //' "/proc/$p/stat" 2>/dev/null) || continue
    set -- $f
    sum=$((sum + ${12} + ${13}))
  done
  echo "$sum"
}
# A kB field of /proc/<pid>/<file>, summed over pids.
kib() {
  local file=$1 field=$2 p sum=0 v
  shift 2
  for p in "$@"; do
    v=$(awk -v f="$field" '$1 == f { print $2 }' "/proc/$p/$file" 2>/dev/null || true)
    sum=$((sum + ${v:-0}))
  done
  echo "$sum"
}
hz=$(getconf CLK_TCK)
row() { echo "$1 $2 $3" >>"$out"; }

for n in "${sizes[@]}"; do
  dir="$work/n$n"
  mkdir -p "$dir"
  out="$work/rows-$n"
  : >"$out"
  # Below the kernel's ephemeral ports (32768 up), which the last run's
  # connections may still hold.
  port=$((20000 + RANDOM % 12000))
  head="127.0.0.1:$port"
  export PRISM_OBJECT_STORE_WARM_BYTES=0
  store=$((64 << 20))
  echo "== $n nodes: head at $head, $dir" >&2

  "$prism" start --head --block --port "$port" --node-ip-address 127.0.0.1 --num-cpus 0 \
    --object-store-memory "$store" --include-dashboard false --temp-dir "$dir/head" \
    >"$dir/head.log" 2>&1 &
  head_pid=$!
  started+=("$head_pid")
  for _ in $(seq 300); do
    ls "$dir/head/nodes/"*.json >/dev/null 2>&1 && break
    kill -0 "$head_pid" 2>/dev/null || { cat "$dir/head.log" >&2; exit 1; }
    sleep 0.1
  done
  gcs_pid=$(pgrep -P "$head_pid" -f gcs-server | head -1 || true)
  [ -n "$gcs_pid" ] || { echo "no control store under pid $head_pid" >&2; exit 1; }
  status() { "$prism" status --address "$head" --temp-dir "$dir/head"; }

  # The nodes, in batches, each waited for before the next batch starts.
  node_pids=()
  t0=$(now_ms)
  for ((i = 1; i <= n; i++)); do
    "$prism" start --address "$head" --block --node-ip-address 127.0.0.1 \
      --num-cpus "$node_cpus" --object-store-memory "$store" \
      --token-file "$dir/head/token" --temp-dir "$dir/node$i" >"$dir/node$i.log" 2>&1 &
    node_pids+=($!)
    started+=($!)
    if ((i % batch == 0 || i == n)); then
      for _ in $(seq 600); do
        alive=$(status 2>/dev/null | awk '/^Nodes:/ { print $2 }' || true)
        [ "${alive:-0}" -ge $((i + 1)) ] && break
        sleep 0.1
      done
      [ "${alive:-0}" -ge $((i + 1)) ] || {
        echo "only ${alive:-0} of $((i + 1)) nodes joined within 60 s" >&2
        exit 1
      }
    fi
  done
  t1=$(now_ms)
  row nodes_joined "$n" nodes
  row join_time "$(awk -v t=$((t1 - t0)) 'BEGIN { printf "%.2f", t / 1000 }')" s

  # Idle: N nodes heartbeating, no work.
  sleep 5
  c0=$(ticks "$gcs_pid"); r0=$(ticks "$head_pid"); k0=$(ticks "${node_pids[@]}")
  w0=$(now_ms)
  sleep 10
  c1=$(ticks "$gcs_pid"); r1=$(ticks "$head_pid"); k1=$(ticks "${node_pids[@]}")
  span=$(($(now_ms) - w0))
  share() { awk -v d="$1" -v hz="$hz" -v ms="$span" -v per="${2:-1}" 'BEGIN { printf "%.4f", d / hz / (ms / 1000) / per }'; }
  row idle_head_cpu "$(share $(((c1 - c0) + (r1 - r0))))" cores
  row idle_control_store_cpu "$(share $((c1 - c0)))" cores
  row idle_head_raylet_cpu "$(share $((r1 - r0)))" cores
  row idle_head_cpu_per_node_ms_per_s "$(awk -v v="$(share $(((c1 - c0) + (r1 - r0))) "$n")" 'BEGIN { printf "%.3f", v * 1000 }')" ms/s
  row idle_all_nodes_cpu "$(share $((k1 - k0)))" cores
  row idle_cpu_per_node_process "$(awk -v v="$(share $((k1 - k0)) "$n")" 'BEGIN { printf "%.3f", v * 1000 }')" ms/s
  mib() { awk -v k="$1" -v per="${2:-1}" 'BEGIN { printf "%.1f", k / 1024 / per }'; }
  row idle_control_store_rss "$(mib "$(kib status VmRSS: "$gcs_pid")")" MiB
  row idle_control_store_pss "$(mib "$(kib smaps_rollup Pss: "$gcs_pid")")" MiB
  row idle_head_raylet_rss "$(mib "$(kib status VmRSS: "$head_pid")")" MiB
  row idle_head_raylet_pss "$(mib "$(kib smaps_rollup Pss: "$head_pid")")" MiB
  row idle_node_rss_mean "$(mib "$(kib status VmRSS: "${node_pids[@]}")" "$n")" MiB
  row idle_node_pss_mean "$(mib "$(kib smaps_rollup Pss: "${node_pids[@]}")" "$n")" MiB

  # `prism status`: median of 5.
  times=()
  for _ in 1 2 3 4 5; do
    a=$(date +%s%N); status >/dev/null; b=$(date +%s%N)
    times+=($(((b - a) / 1000)))
  done
  row status_time "$(printf '%s\n' "${times[@]}" | sort -n | awk 'NR == 3 { printf "%.1f", $1 / 1000 }')" ms

  # Actors, placement groups and tasks, from a driver on the head.
  if ! PRISM_ADDRESS="$head" PRISM_TEMP_DIR="$dir/head" timeout 600 "$envelope" \
    --actors "$actors" --groups "$groups" --tasks "$tasks" \
    --head-pids "$head_pid,$gcs_pid" >"$dir/driver.log" 2>&1; then
    echo "the driver failed at $n nodes; its output:" >&2
    tail -20 "$dir/driver.log" >&2
  fi
  awk '$1 == "ROW" { print $2, $3, $4 }' "$dir/driver.log" >>"$out"
  row after_control_store_rss "$(mib "$(kib status VmRSS: "$gcs_pid")")" MiB
  row after_head_raylet_rss "$(mib "$(kib status VmRSS: "$head_pid")")" MiB
  row peak_control_store_rss "$(mib "$(kib status VmHWM: "$gcs_pid")")" MiB
  row peak_head_raylet_rss "$(mib "$(kib status VmHWM: "$head_pid")")" MiB

  # Death detection: SIGKILL the last node (after the driver:
  # a node dying while the driver starts is another test), poll `prism status`.
  victim=${node_pids[n - 1]}
  victim_id=$(grep -ho '"node_id":"[^"]*"' "$dir/node$n/nodes/"*.json | head -1 | cut -d'"' -f4 || true)
  kill -KILL "$victim"
  a=$(now_ms)
  dead=""
  while (($(now_ms) - a < 30000)); do
    if status 2>/dev/null | grep -q "$victim_id .*DEAD"; then
      dead=$(($(now_ms) - a))
      break
    fi
    sleep 0.05
  done
  row dead_detection "$(awk -v t="${dead:-nan}" 'BEGIN { printf "%.2f", t / 1000 }')" s

  stop_all
  cat "$out" >&2
done

# One table: a row per figure, a column per N.
echo
{
  printf 'figure unit'
  for n in "${sizes[@]}"; do printf ' N=%s' "$n"; done
  echo
  awk '{ if (!($1 in seen)) { seen[$1] = 1; order[++k] = $1; unit[$1] = $3 } }
       END { for (i = 1; i <= k; i++) print order[i], unit[order[i]] }' \
    $(for n in "${sizes[@]}"; do echo "$work/rows-$n"; done) |
    while read -r name unit; do
      printf '%s %s' "$name" "$unit"
      for n in "${sizes[@]}"; do
        v=$(awk -v k="$name" '$1 == k { print $2 }' "$work/rows-$n" | head -1)
        printf ' %s' "${v:--}"
      done
      echo
    done
} | column -t
