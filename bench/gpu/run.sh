#!/usr/bin/env bash
# Runs every GPU check and benchmark of a bundle made by bench/gpu/bundle.sh,
# on a machine with an NVIDIA GPU and a CUDA build of PyTorch (no Rust
# toolchain, no network). From the bundle's folder:
#
#   bash run.sh [--quick]
#
# It finds PyTorch's libraries (libtorch, NVRTC and the other CUDA wheels)
# through the python3 on PATH (or $PYTHON), then prints:
#   1. the CUDA all-reduce check and timings at world 2 and 4, next to gloo
#      on CUDA tensors and the device-to-device copy ceiling;
#   2. Fashion-MNIST data-parallel training on the GPU (2 workers sharing
#      it, MLP and CNN) next to one PyTorch process doing the same training,
#      and again under MPS where nvidia-cuda-mps-control exists
#      (PRISM_BENCH_MPS=0 skips that);
#   3. linear regression with --use-gpu.
# Everything it prints also goes to results/run.log.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here"
python="${PYTHON:-python3}"
quick=0
[ "${1:-}" = "--quick" ] && quick=1
mkdir -p results
log="$here/results/run.log"
: >"$log"
say() { echo "$@" | tee -a "$log"; }
run() { "$@" 2>&1 | tee -a "$log"; return "${PIPESTATUS[0]}"; }

torch_lib="$("$python" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))' 2>/dev/null)"
if [ -z "$torch_lib" ]; then
  echo "run.sh: $python cannot import torch; set PYTHON to a Python with a CUDA build of PyTorch" >&2
  exit 1
fi
site="$(dirname "$(dirname "$torch_lib")")"
libs="$torch_lib"
for d in "$site"/nvidia/*/lib "$site"/nvidia/*/*/lib; do
  [ -d "$d" ] && libs="$libs:$d"
done
export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
failed=0

say "# machine: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1), $(nproc) cores"
say "# $("$python" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)')"

say "== 1. CUDA all-reduce (processes sharing GPU 0) against gloo on CUDA tensors"
max_bytes=$((256 << 20))
[ "$quick" = 1 ] && max_bytes=$((16 << 20))
run ./bin/cuda_collective --worlds 2,4 --max-bytes "$max_bytes" || { say "cuda_collective FAILED"; failed=1; }
run "$python" gloo_allreduce.py --device cuda --worlds 2,4 --max-bytes "$max_bytes" || say "gloo comparison failed"
"$python" table.py "$log" | tee -a "$log"
say "== 1b. The host-staged CUDA path (what ranks on different GPUs use), forced on one GPU"
PRISM_COLLECTIVE_CUDA_IPC=0 run ./bin/cuda_collective --worlds 2 --max-bytes $((16 << 20)) \
  || { say "cuda_collective with host staging FAILED"; failed=1; }

if [ -x ./bin/fashion_mnist ]; then
  say "== 2. Fashion-MNIST on the GPU: 2 Prism workers sharing it, against one PyTorch process"
  data="$here/data/fashion-mnist.bin"
  if [ ! -f "$data" ] && [ -f "$here/data/fashion-mnist.bin.gz" ]; then
    gzip -dc "$here/data/fashion-mnist.bin.gz" >"$data"
  fi
  for model in mlp cnn; do
    epochs=""
    [ "$quick" = 1 ] && epochs="--epochs 2"
    # shellcheck disable=SC2086
    run ./bin/fashion_mnist --ingest device --use-gpu --model "$model" $epochs --data "$data" \
      || { say "fashion_mnist --model $model FAILED"; failed=1; }
    # shellcheck disable=SC2086
    run "$python" fashion_mnist_torch.py --model "$model" $epochs --data "$data" \
      || say "the PyTorch baseline failed"
  done
  # Without MPS, the two workers' processes take turns on the GPU; with it
  # their kernels share it. The daemon started here uses a private pipe
  # folder, so it serves only this run's processes, and is stopped after.
  if command -v nvidia-cuda-mps-control >/dev/null && [ "${PRISM_BENCH_MPS:-1}" = 1 ]; then
    mps="$(mktemp -d)"
    export CUDA_MPS_PIPE_DIRECTORY="$mps/pipe" CUDA_MPS_LOG_DIRECTORY="$mps/log"
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    if nvidia-cuda-mps-control -d; then
      say "== 2b. The same Prism training with the workers under MPS"
      for model in mlp cnn; do
        epochs=""
        [ "$quick" = 1 ] && epochs="--epochs 2"
        # shellcheck disable=SC2086
        ./bin/fashion_mnist --ingest device --use-gpu --model "$model" $epochs --data "$data" 2>&1 \
          | sed 's/^prism-train /prism-train-mps /' | tee -a "$log"
        [ "${PIPESTATUS[0]}" = 0 ] || { say "fashion_mnist --model $model under MPS FAILED"; failed=1; }
      done
      echo quit | nvidia-cuda-mps-control
    fi
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
    rm -rf "$mps"
  fi
  say "# per-epoch training time, median over epochs (Prism: rank 0 of 2 workers sharing the GPU)"
  grep -E "^(prism-train|prism-train-mps|torch-1proc) " "$log" | tee -a "$log.summary"
fi

if [ -x ./bin/linear_regression ]; then
  say "== 3. Linear regression with --use-gpu"
  run ./bin/linear_regression --use-gpu || { say "linear_regression --use-gpu FAILED"; failed=1; }
fi

say "== done: $([ "$failed" = 0 ] && echo 'every check passed' || echo 'SOME CHECKS FAILED') (log: results/run.log)"
exit "$failed"
