#!/usr/bin/env bash
# Runs every check and benchmark of a bundle made by bench/gpu/bundle.sh,
# on a machine with an NVIDIA GPU and a CUDA build of PyTorch (no Rust
# toolchain, no network). From the bundle's folder:
#
#   bash run.sh [--quick]
#
# It unpacks the compressed binaries and data (once), finds PyTorch's
# libraries (libtorch, NVRTC and the other CUDA wheels) through the python3
# on PATH (or $PYTHON), then prints:
#   1. the CUDA all-reduce check and timings at world 2 and 4, next to gloo
#      on CUDA tensors and the device-to-device copy ceiling;
#   2. Fashion-MNIST data-parallel training on the GPU (2 workers sharing
#      it; MLP, CNN and ViT) next to one PyTorch process doing the same
#      training, the MLP and CNN again with the all-reduce ordered on the
#      device instead of waited for on the host
#      (PRISM_COLLECTIVE_CUDA_STREAM_ORDERED=1), and again under
#      MPS where nvidia-cuda-mps-control exists (PRISM_BENCH_MPS=0 skips
#      that);
#   3. linear regression with --use-gpu;
#   4. the machine's cores: task and actor-call throughput against 1-16
#      clients (scaling; the task rows again with the waits' polling bounded
#      by the load, PRISM_SPIN_MAX_LOAD_PERCENT=200, and off,
#      PRISM_SPIN_WAIT_US=0), and the shared-memory all-reduce at world 8
#      next to gloo with the memcpy ceiling.
# PRISM_BENCH_SECTIONS picks sections (default "1 2 3 4"), and
# PRISM_BENCH_MODELS the models of section 2 (default "mlp cnn vit").
# Everything it prints also goes to results/run.log.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here"
python="${PYTHON:-python3}"
quick=0
[ "${1:-}" = "--quick" ] && quick=1
sections=" ${PRISM_BENCH_SECTIONS:-1 2 3 4} "
models="${PRISM_BENCH_MODELS:-mlp cnn vit}"
wants() { [[ "$sections" == *" $1 "* ]]; }
mkdir -p results
log="$here/results/run.log"
: >"$log"
say() { echo "$@" | tee -a "$log"; }
run() { "$@" 2>&1 | tee -a "$log"; return "${PIPESTATUS[0]}"; }

# The binaries and the data travel compressed; unpack each once.
"$python" - <<'PY' || { echo "run.sh: unpacking the bundle failed" >&2; exit 1; }
import glob, gzip, lzma, os, shutil
for packed in glob.glob("bin/*.xz") + glob.glob("data/*.xz") + glob.glob("data/*.gz"):
    plain = packed.rsplit(".", 1)[0]
    if os.path.exists(plain):
        continue
    opener = lzma.open if packed.endswith(".xz") else gzip.open
    with opener(packed) as src, open(plain + ".part", "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    os.replace(plain + ".part", plain)
    if packed.startswith("bin/"):
        os.chmod(plain, 0o755)
PY

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

if wants 1; then
say "== 1. CUDA all-reduce (processes sharing GPU 0) against gloo on CUDA tensors"
max_bytes=$((256 << 20))
[ "$quick" = 1 ] && max_bytes=$((16 << 20))
run ./bin/cuda_collective --worlds 2,4 --max-bytes "$max_bytes" || { say "cuda_collective FAILED"; failed=1; }
run "$python" gloo_allreduce.py --device cuda --worlds 2,4 --max-bytes "$max_bytes" || say "gloo comparison failed"
"$python" table.py "$log" | tee -a "$log"
say "== 1b. The host-staged CUDA path (what ranks on different GPUs use), forced on one GPU"
PRISM_COLLECTIVE_CUDA_IPC=0 run ./bin/cuda_collective --worlds 2 --max-bytes $((16 << 20)) \
  || { say "cuda_collective with host staging FAILED"; failed=1; }
say "== 1c. The same-GPU path ordered on the device (interprocess events), not waited for on the host"
PRISM_COLLECTIVE_CUDA_STREAM_ORDERED=1 run ./bin/cuda_collective --worlds 2,4 --max-bytes $((16 << 20)) \
  || { say "cuda_collective ordered on the device FAILED"; failed=1; }
fi

if [ -x ./bin/fashion_mnist ] && wants 2; then
  say "== 2. Fashion-MNIST on the GPU: 2 Prism workers sharing it, against one PyTorch process"
  data="$here/data/fashion-mnist.bin"
  for model in $models; do
    epochs=""
    [ "$quick" = 1 ] && epochs="--epochs 2"
    # shellcheck disable=SC2086
    run ./bin/fashion_mnist --ingest device --use-gpu --model "$model" $epochs --data "$data" \
      || { say "fashion_mnist --model $model FAILED"; failed=1; }
    # shellcheck disable=SC2086
    run "$python" fashion_mnist_torch.py --model "$model" $epochs --data "$data" \
      || say "the PyTorch baseline failed"
  done
  say "== 2a. The same Prism training with the all-reduce ordered on the device"
  for model in $models; do
    [ "$model" = vit ] && continue
    epochs=""
    [ "$quick" = 1 ] && epochs="--epochs 2"
    # shellcheck disable=SC2086
    PRISM_COLLECTIVE_CUDA_STREAM_ORDERED=1 ./bin/fashion_mnist --ingest device --use-gpu \
      --model "$model" $epochs --data "$data" 2>&1 \
      | sed 's/^prism-train /prism-train-ordered /' | tee -a "$log"
    [ "${PIPESTATUS[0]}" = 0 ] || { say "fashion_mnist --model $model ordered on the device FAILED"; failed=1; }
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
      for model in $models; do
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
  grep -E "^(prism-train|prism-train-ordered|prism-train-mps|torch-1proc) " "$log" | tee -a "$log.summary"
fi

if [ -x ./bin/linear_regression ] && wants 3; then
  say "== 3. Linear regression with --use-gpu"
  run ./bin/linear_regression --use-gpu || { say "linear_regression --use-gpu FAILED"; failed=1; }
fi

if wants 4; then
  say "== 4. The machine's $(nproc) cores: throughput against clients, shared-memory all-reduce at world 8"
  for round in 1 2; do
    say "# round $round"
    PRISM_BENCH_ROWS=clients_ run ./bin/scaling || { say "scaling FAILED"; failed=1; }
    # The waits' polling: bounded by the machine's load, and off.
    PRISM_SPIN_MAX_LOAD_PERCENT=200 PRISM_BENCH_ROWS=clients_tasks ./bin/scaling 2>&1 \
      | sed 's/^clients_/spin_limited_clients_/' | tee -a "$log"
    PRISM_SPIN_WAIT_US=0 PRISM_BENCH_ROWS=clients_tasks ./bin/scaling 2>&1 \
      | sed 's/^clients_/no_spin_clients_/' | tee -a "$log"
  done
  PRISM_BENCH_ROWS=client_tasks run ./bin/microbenchmark \
    || { say "microbenchmark FAILED"; failed=1; }
  out="$here/results/collective"
  rm -rf "$out"
  mkdir -p "$out"
  for round in 1 2; do
    ./bin/collective_bench --worlds 8 --min-bytes $((16 << 20)) --max-bytes $((64 << 20)) \
      >"$out/prism.$round.txt" 2>&1 || { say "collective_bench FAILED"; failed=1; }
    "$python" gloo_allreduce.py --worlds 8 --min-bytes $((16 << 20)) --max-bytes $((64 << 20)) \
      >"$out/gloo.$round.txt" 2>&1 || say "the gloo comparison failed"
  done
  "$python" collective_table.py "$out" | tee -a "$log"
fi

say "== done: $([ "$failed" = 0 ] && echo 'every check passed' || echo 'SOME CHECKS FAILED') (log: results/run.log)"
exit "$failed"
