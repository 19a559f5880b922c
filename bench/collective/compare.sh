#!/usr/bin/env bash
# Prism's collectives (all-reduce unless --op says otherwise) next to
# torch.distributed gloo on this machine, same sizes, same world sizes, same
# timing, plus the memcpy ceiling; prints one markdown table. Usage (from the
# repository root):
#
#   bash bench/collective/compare.sh [--op all_reduce|all_gather|reduce_scatter|broadcast] \
#       [--worlds 2,4] [--min-bytes 4096] [--max-bytes 268435456]
#
# Both run REPEATS times (default 3), alternating, and the table keeps each
# implementation's best run per size: on a shared machine that is the figure
# least disturbed by other work. Set PRISM_COLLECTIVE_TRANSPORT=tcp to
# compare Prism's TCP transport instead of shared memory. The raw rows go to
# bench/collective/out/.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="$here/out"
repeats="${REPEATS:-3}"
rm -rf "$out"
mkdir -p "$out"
bash "$here/setup.sh"
(cd "$root" && cargo build --release -p prism-collective --example collective_bench)
target="${CARGO_TARGET_DIR:-$root/target}"
transport="${PRISM_COLLECTIVE_TRANSPORT:-auto}"
for i in $(seq 1 "$repeats"); do
  uptime | sed 's/^/# /' >> "$out/load.txt"
  "$target/release/examples/collective_bench" --transport "$transport" "$@" > "$out/prism.$i.txt"
  "$here/.venv/bin/python" "$here/gloo_allreduce.py" "$@" > "$out/gloo.$i.txt"
done
uptime | sed 's/^/# /' >> "$out/load.txt"
python3 "$here/table.py" "$out"
