#!/usr/bin/env bash
# From a node's start to the first task it runs, on this machine: a head
# with one CPU, a driver whose task asks for `accel` (which no node has, so
# it waits), then a second node with `accel` started by hand. The driver is
# the launcher tests' `launcher_scaling_driver`, run from a copy that is
# removed once it runs, so the new node cannot find the driver's file at
# its path and fetches the program from the driver, as a node on another
# machine does. Prints, per round, the fetch's size and time (from the new
# node's log) and the time from `prism start` to the task's start.
#
# Run: bash bench/launcher/join_to_task.sh
# Environment: PRISM (default: the debug build's prism under
# $CARGO_TARGET_DIR or target/), DRIVER (default: the launcher test binary,
# built with `cargo test -p prism-cli --test launcher --no-run`), ROUNDS
# (default 3), PORT (default 6390). Everything it starts is stopped, and
# its folder removed, on exit.
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
TARGET="${CARGO_TARGET_DIR:-$REPO/target}"
PRISM="${PRISM:-$TARGET/debug/prism}"
if [ -z "${DRIVER:-}" ]; then
  DRIVER=$(cd "$REPO" && cargo test -q -p prism-cli --test launcher --no-run --message-format=json 2>/dev/null |
    python3 -c 'import json,sys
for l in sys.stdin:
    m=json.loads(l)
    if m.get("reason")=="compiler-artifact" and m.get("executable") and m["target"]["name"]=="launcher": print(m["executable"])' | tail -1)
fi
ROUNDS="${ROUNDS:-3}"
PORT="${PORT:-6390}"
DIR="/tmp/prism-join-to-task-$$"
[ -x "$PRISM" ] || { echo "no prism at $PRISM: build it with cargo build -p prism-cli" >&2; exit 2; }
[ -x "$DRIVER" ] || { echo "no driver at '$DRIVER': build it with cargo test -p prism-cli --test launcher --no-run" >&2; exit 2; }

DRIVER_PID=
cleanup() {
  [ -n "$DRIVER_PID" ] && kill "$DRIVER_PID" 2>/dev/null
  "$PRISM" stop --temp-dir "$DIR/node" >/dev/null 2>&1
  "$PRISM" stop --temp-dir "$DIR/head" >/dev/null 2>&1
  rm -rf "$DIR"
}
trap cleanup EXIT

ms() { date +%s%3N; }
echo "driver $DRIVER ($(stat -c %s "$DRIVER") bytes), prism $PRISM"
for round in $(seq 1 "$ROUNDS"); do
  cleanup
  mkdir -p "$DIR"
  export PRISM_INFEASIBLE_WAIT_MS=600000
  "$PRISM" start --head --port "$PORT" --num-cpus 1 --include-dashboard false \
    --temp-dir "$DIR/head" >"$DIR/head.out" 2>&1 || { cat "$DIR/head.out"; exit 1; }
  cp "$DRIVER" "$DIR/driver"
  PRISM_AUTH_TOKEN=$(cat "$DIR/head/token") PRISM_ADDRESS="127.0.0.1:$PORT" PRISM_TEMP_DIR="$DIR/head" \
    "$DIR/driver" --ignored --exact launcher_scaling_driver --nocapture >"$DIR/driver.out" 2>&1 &
  DRIVER_PID=$!
  # The driver has submitted its accel task once the head lists its demand.
  for _ in $(seq 1 100); do
    "$PRISM" status --address "127.0.0.1:$PORT" --token-file "$DIR/head/token" 2>/dev/null |
      grep -q accel && break
    sleep 0.1
  done
  rm "$DIR/driver"
  started=$(ms)
  "$PRISM" start --address "127.0.0.1:$PORT" --num-cpus 1 --resources '{"accel": 1}' \
    --token-file "$DIR/head/token" --temp-dir "$DIR/node" >"$DIR/node.out" 2>&1 ||
    { cat "$DIR/node.out"; exit 1; }
  ran=
  for _ in $(seq 1 300); do
    ran=$(grep -o "started at [0-9]* ms" "$DIR/driver.out" | grep -o "[0-9]*")
    [ -n "$ran" ] && break
    sleep 0.1
  done
  [ -n "$ran" ] || { echo "round $round: the task did not run within 30 s"; cat "$DIR/driver.out"; exit 1; }
  fetch=$(grep -ho "fetched a job's program.*" "$DIR"/node/logs/*.log 2>/dev/null |
    grep -o "bytes=[0-9]* of=[0-9]*\|bytes=[0-9]*\|ms=[0-9]*" | tr '\n' ' ')
  echo "round $round: prism start -> task started $((ran - started)) ms; fetch: ${fetch:-none}"
  kill "$DRIVER_PID" 2>/dev/null; wait "$DRIVER_PID" 2>/dev/null; DRIVER_PID=
done
