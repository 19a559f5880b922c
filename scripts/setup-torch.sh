#!/usr/bin/env bash
# Installs the PyTorch that prism-train's `tch` feature builds against, from
# PyPI, into a virtual environment, and writes an env file for cargo.
#
#   bash scripts/setup-torch.sh          # lean: CPU use, about 600 MB
#   . "$HOME/.cache/prism/torch-2.11.0/prism-torch.env"
#   cargo test -p prism-train --features tch --test torch
#
# Why PyPI: tch 0.24 pins PyTorch 2.11.0 (tch 0.26 wants 2.13 and does not
# build against 2.11), and the PyPI wheel carries libtorch, its headers and
# its CUDA libraries. torch-sys is pointed at the wheel's torch/ folder.
#
# Lean install (the default): `torch` itself without its dependencies, plus
# the two CUDA wheels libtorch_cpu.so needs to load (the CUDA runtime and
# CUPTI, at the versions torch's own metadata pins). That builds and runs on
# a machine with no GPU, but `import torch` does not work in it (Python's
# torch loads libtorch_cuda). The full CUDA stack (cuBLAS, cuDNN, NCCL, ...)
# is several more gigabytes; ask for it with PRISM_TORCH_CUDA=1, which also
# makes train/build.rs link libtorch_cuda so that tch::Cuda::is_available()
# can be true.
#
# Environment:
#   PRISM_TORCH_VENV   where the environment goes (default
#                      $HOME/.cache/prism/torch-2.11.0)
#   PRISM_TORCH_PYTHON the interpreter that creates it (default python3.11)
#   PRISM_TORCH_CUDA   1: install torch with every dependency (GPU machines)
#
# Idempotent: a second run that finds a complete install only prints how to
# use it (well under a second).
set -euo pipefail

torch_version="2.11.0"
venv="${PRISM_TORCH_VENV:-$HOME/.cache/prism/torch-$torch_version}"
python="${PRISM_TORCH_PYTHON:-python3.11}"
cuda="${PRISM_TORCH_CUDA:-0}"
env_file="$venv/prism-torch.env"
stamp="$venv/prism-torch.stamp"
want_stamp="torch==$torch_version cuda=$cuda"

usage() {
  cat <<EOF
PyTorch $torch_version is ready in $venv (full CUDA stack: $cuda).
Before building prism-train with --features tch, load the environment:
  . "$env_file"
then, for instance:
  cargo test -p prism-train --features tch --test torch
EOF
}

if [[ -f "$stamp" && "$(cat "$stamp")" == "$want_stamp" && -f "$env_file" ]] &&
  compgen -G "$venv/lib/python3*/site-packages/torch/lib/libtorch_cpu.so" >/dev/null; then
  usage
  exit 0
fi
rm -f "$stamp"

if [[ ! -x "$venv/bin/python" ]]; then
  if ! command -v "$python" >/dev/null 2>&1; then
    echo "setup-torch: $python not found; torch $torch_version wheels need CPython 3.10 to 3.14; set PRISM_TORCH_PYTHON to one" >&2
    exit 1
  fi
  echo "setup-torch: creating $venv with $python"
  mkdir -p "$(dirname "$venv")"
  "$python" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip install --disable-pip-version-check --progress-bar off)

site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
torch_dir="$site/torch"
lib_dir="$torch_dir/lib"

# Requirements of an installed distribution, markers evaluated for this
# machine with the given extras, one per line without the marker.
requires() {
  "$venv/bin/python" - "$@" <<'EOF'
import importlib.metadata as md, sys
from pip._vendor.packaging.requirements import Requirement
dist, extras = sys.argv[1], sys.argv[2:] or [""]
for line in md.requires(dist) or []:
    req = Requirement(line)
    if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in extras):
        print(str(req).split(";")[0].strip())
EOF
}

if [[ "$cuda" == "1" ]]; then
  echo "setup-torch: installing torch==$torch_version with its full CUDA stack"
  "${pip[@]}" "torch==$torch_version"
else
  echo "setup-torch: installing torch==$torch_version without dependencies"
  "${pip[@]}" --no-deps "torch==$torch_version"
  # libtorch_cpu.so needs libcudart and libcupti to load, even with no GPU.
  # torch 2.11 takes them through the cuda-toolkit meta-package (extras
  # cudart and cupti, pinning nvidia-cuda-runtime / nvidia-cuda-cupti);
  # older wheels named nvidia-cuda-{runtime,cupti}-cuXX directly.
  cuda_wheels=()
  while read -r req; do
    case "$req" in
      cuda-toolkit*)
        "${pip[@]}" --no-deps "${req%%[*}${req#*]}"
        while read -r sub; do
          case "$sub" in nvidia-cuda-runtime* | nvidia-cuda-cupti*) cuda_wheels+=("$sub") ;; esac
        done < <(requires cuda-toolkit cudart cupti)
        ;;
      nvidia-cuda-runtime* | nvidia-cuda-cupti*) cuda_wheels+=("$req") ;;
    esac
  done < <(requires torch)
  if ((${#cuda_wheels[@]} == 0)); then
    echo "setup-torch: found no CUDA runtime requirement in torch's metadata; set PRISM_TORCH_CUDA=1 for a full install" >&2
    exit 1
  fi
  echo "setup-torch: installing ${cuda_wheels[*]}"
  "${pip[@]}" --no-deps "${cuda_wheels[@]}"
fi

# Verify what a build and a test binary will use: the version, the headers,
# and that libtorch_cpu.so finds every library it needs.
found_version="$("$venv/bin/python" -c 'import importlib.metadata as md; print(md.version("torch").split("+")[0])')"
if [[ "$found_version" != "$torch_version" ]]; then
  echo "setup-torch: found torch $found_version in $venv, want $torch_version; remove $venv and run again" >&2
  exit 1
fi
if [[ ! -f "$lib_dir/libtorch_cpu.so" || ! -d "$torch_dir/include/torch/csrc/api/include" ]]; then
  echo "setup-torch: libtorch_cpu.so or the C++ headers are missing under $torch_dir; remove $venv and run again" >&2
  exit 1
fi
if missing="$(ldd "$lib_dir/libtorch_cpu.so" | grep 'not found')"; then
  echo "setup-torch: libtorch_cpu.so cannot load:" >&2
  echo "$missing" >&2
  exit 1
fi
if [[ "$cuda" == "1" ]]; then
  "$venv/bin/python" -c 'import torch; print("setup-torch: torch", torch.__version__, "CUDA available:", torch.cuda.is_available())'
fi

cat >"$env_file" <<EOF
# Written by scripts/setup-torch.sh: the environment a build of prism-train
# with --features tch needs. Source it: . "$env_file"
#
# torch-sys reads headers and libraries straight from the wheel's torch/
# folder. (LIBTORCH_USE_PYTORCH=1 would instead run \`import torch\`, which
# needs the whole CUDA stack that a lean install leaves out.) PyTorch wheels
# since 2.8 use the C++11 ABI.
export LIBTORCH="$torch_dir"
export LIBTORCH_CXX11_ABI=1
unset LIBTORCH_USE_PYTORCH LIBTORCH_INCLUDE LIBTORCH_LIB
# train/build.rs puts this in the rpath of the crate's tests and binaries, so
# they run without LD_LIBRARY_PATH.
export PRISM_LIBTORCH_LIB="$lib_dir"
# 1: link libtorch_cuda too (only with the full CUDA stack installed).
export PRISM_TORCH_CUDA=$cuda
EOF
echo "$want_stamp" >"$stamp"
usage
