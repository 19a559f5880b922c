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
(cd "$root" && cargo build --release -p prism-collective --features cuda --example cuda_collective)
target="${CARGO_TARGET_DIR:-$root/target}"
log="$(mktemp)"
# The venv's torch carries NVRTC; the driver comes from the system.
torch_lib="$("$here/.venv/bin/python" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')"
site="$(dirname "$(dirname "$torch_lib")")"
libs="$torch_lib"
for d in "$site"/nvidia/*/lib "$site"/nvidia/*/*/lib; do [ -d "$d" ] && libs="$libs:$d"; done
LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$target/release/examples/cuda_collective" "$@" | tee "$log"
"$here/.venv/bin/python" "$here/gloo_allreduce.py" --device cuda "$@" | tee -a "$log"
python3 "$root/bench/gpu/table.py" "$log"
rm -f "$log"
