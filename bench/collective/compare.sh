#!/usr/bin/env bash
# Prism's all-reduce next to torch.distributed gloo on this machine, same
# sizes, same world sizes, same timing, plus the memcpy ceiling; prints one
# markdown table. Usage (from the repository root):
#
#   bash bench/collective/compare.sh [--worlds 2,4] [--min-bytes 4096] [--max-bytes 268435456]
#
# Set PRISM_COLLECTIVE_TRANSPORT=tcp to compare Prism's TCP transport instead
# of shared memory. The raw rows go to bench/collective/out/.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="$here/out"
mkdir -p "$out"
bash "$here/setup.sh"
(cd "$root" && cargo build --release -p prism-train --example collective_bench)
target="${CARGO_TARGET_DIR:-$root/target}"
transport="${PRISM_COLLECTIVE_TRANSPORT:-auto}"
"$target/release/examples/collective_bench" --transport "$transport" "$@" | tee "$out/prism.txt"
"$here/.venv/bin/python" "$here/gloo_allreduce.py" "$@" | tee "$out/gloo.txt"
python3 "$here/table.py" "$out/prism.txt" "$out/gloo.txt"
