#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: Prism's CUDA all-reduce (processes sharing
# GPU 0, after an f64 correctness check) next to gloo all_reduce on CUDA
# tensors, same sizes and world sizes, plus the device-to-device copy
# ceiling. Usage (from the repository root):
#
#   bash bench/collective/compare_cuda.sh [--worlds 2,4] [--max-bytes 268435456]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
bash "$here/setup.sh"
(cd "$root" && cargo build --release -p prism-train --features cuda --example cuda_collective)
target="${CARGO_TARGET_DIR:-$root/target}"
"$target/release/examples/cuda_collective" "$@"
"$here/.venv/bin/python" "$here/gloo_allreduce.py" --device cuda "$@"
