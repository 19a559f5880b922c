#!/usr/bin/env bash
# Two Prism nodes of one CPU each, in network namespaces of their own on a
# bridge (10.78.0.1 the head, 10.78.0.2 the other), started with the
# `prism` command; then examples/cross_node.rs runs on the head. Needs
# root and iproute2. Everything made is removed at the end.
set -euo pipefail
cd "$(dirname "$0")/../.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/prism/target}"
cargo build -q --release -p prism-cli --bin prism
cargo build -q --release -p prism-examples --example cross_node
prism="$CARGO_TARGET_DIR/release/prism"
tag="pxb$$"
temp="$(mktemp -d /tmp/prism-cross.XXXXXX)"
cleanup() {
  for h in 0 1; do
    ip netns exec "$tag-h$h" "$prism" stop --force --temp-dir "$temp/h$h" >/dev/null 2>&1 || true
    ip netns del "$tag-h$h" 2>/dev/null || true
  done
  ip netns del "$tag-sw" 2>/dev/null || true
  rm -rf "$temp"
}
trap cleanup EXIT
[ -n "${KEEP:-}" ] && trap - EXIT
ip netns add "$tag-sw"
ip -n "$tag-sw" link add br0 type bridge
ip -n "$tag-sw" link set br0 up
for h in 0 1; do
  ip netns add "$tag-h$h"
  ip link add "v$h" netns "$tag-sw" type veth peer name eth0 netns "$tag-h$h"
  ip -n "$tag-sw" link set "v$h" master br0 up
  ip -n "$tag-h$h" addr add "10.78.0.$((h + 1))/24" dev eth0
  ip -n "$tag-h$h" link set eth0 up
  ip -n "$tag-h$h" link set lo up
done
ip netns exec "$tag-h0" "$prism" start --head --port 6380 --node-ip-address 10.78.0.1 \
  --num-cpus 1 --temp-dir "$temp/h0" >/dev/null
ip netns exec "$tag-h1" "$prism" start --address 10.78.0.1:6380 --node-ip-address 10.78.0.2 \
  --num-cpus 1 --temp-dir "$temp/h1" --token "$(cat "$temp/h0/token")" >/dev/null
sleep 1.5 # one heartbeat: each raylet has the other in its view
ip netns exec "$tag-h0" env PRISM_ADDRESS=10.78.0.1:6380 PRISM_TEMP_DIR="$temp/h0" \
  "$CARGO_TARGET_DIR/release/examples/cross_node"
