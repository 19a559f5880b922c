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
. bench/cluster/hosts.sh
make_hosts "pxb$$" 2 10.78.0
temp="$HOSTS_TEMP"
on_host 0 "$prism" start --head --port 6380 --node-ip-address 10.78.0.1 \
  --num-cpus 1 --temp-dir "$temp/h0" >/dev/null
on_host 1 "$prism" start --address 10.78.0.1:6380 --node-ip-address 10.78.0.2 \
  --num-cpus 1 --temp-dir "$temp/h1" --token "$(cat "$temp/h0/token")" >/dev/null
sleep 1.5 # one heartbeat: each raylet has the other in its view
on_host 0 env PRISM_ADDRESS=10.78.0.1:6380 PRISM_TEMP_DIR="$temp/h0" \
  "$CARGO_TARGET_DIR/release/examples/cross_node"
