#!/usr/bin/env bash
# Builds a self-contained bundle for a machine with an NVIDIA GPU and many
# cores: the binaries stripped and compressed (xz), the Fashion-MNIST data
# compressed, the PyTorch comparison scripts and run.sh. Copy the folder
# (or a tarball of it) to any machine with an NVIDIA GPU and a CUDA build of
# PyTorch, and run `bash run.sh` there; it unpacks what it needs.
#
#   bash bench/gpu/bundle.sh [OUT_DIR]     # default: target/gpu-bundle
#
# Needs the tch setup (scripts/setup-torch.sh) for the training examples;
# without it the bundle holds the benchmarks that need no libtorch.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
target="${CARGO_TARGET_DIR:-$root/target}"
out="${1:-$root/target/gpu-bundle}"
rm -rf "$out"
mkdir -p "$out/bin" "$out/data"
cd "$root"
cargo build --release -p prism-collective --features cuda --example cuda_collective
cargo build --release -p prism-collective --example collective_bench
cargo build --release -p prism-examples --example scaling --example microbenchmark
cp "$target/release/examples/cuda_collective" "$target/release/examples/collective_bench" \
  "$target/release/examples/scaling" "$target/release/examples/microbenchmark" "$out/bin/"
env_file="${PRISM_TORCH_VENV:-$HOME/.cache/prism/torch-2.11.0}/prism-torch.env"
if [ -f "$env_file" ]; then
  # shellcheck disable=SC1090
  . "$env_file"
  # Link libtorch_cuda so that tch sees the GPU; the wheel carries it even
  # in the lean install.
  PRISM_TORCH_CUDA=1 cargo build --release -p prism-train --features tch,cuda \
    --example fashion_mnist --example linear_regression
  cp "$target/release/examples/fashion_mnist" "$target/release/examples/linear_regression" "$out/bin/"
  data_file="$(bash scripts/fetch-dataset.sh fashion-mnist | tail -1)"
  xz -9e -T0 -c "$data_file" >"$out/data/fashion-mnist.bin.xz"
else
  echo "bundle.sh: no tch setup ($env_file); the bundle has no training examples" >&2
fi
strip "$out"/bin/*
# run.sh unpacks them with Python's lzma module (no xz needed there).
xz -9 -T0 "$out"/bin/*
cp "$here/run.sh" "$here/table.py" "$root/bench/collective/gloo_allreduce.py" "$out/"
cp "$root/bench/collective/table.py" "$out/collective_table.py"
[ -f "$here/fashion_mnist_torch.py" ] && cp "$here/fashion_mnist_torch.py" "$out/"
du -sh "$out"
echo "bundle ready: $out (run: bash $out/run.sh)"
