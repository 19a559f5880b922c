#!/usr/bin/env bash
# Installs Ray Train's side of the training comparison (train_compare.sh),
# pinned, into its own virtual environment:
#
#   bash bench/ray/setup_train.sh
#   "$HOME/.cache/prism/ray-train-2.60.0/bin/python" bench/ray/train_ray.py --help
#
# ray[train] is the install Ray Train's documentation gives; torch is the
# PyPI wheel (it carries the CUDA libraries, about 2.7 GB in all, of which
# a CPU run loads only libtorch). The environment lives outside the
# repository (PRISM_RAY_TRAIN_VENV to move it) because it is large and
# git does not ignore it under bench/.
#
# Idempotent: does nothing when the environment already holds the pinned
# versions.
set -euo pipefail

RAY_VERSION=2.60.0
TORCH_VERSION=2.13.0
NUMPY_VERSION=2.4.6

venv="${PRISM_RAY_TRAIN_VENV:-$HOME/.cache/prism/ray-train-$RAY_VERSION}"
py="$venv/bin/python"

installed() {
    [[ -x "$py" ]] || return 1
    timeout 120 "$py" - "$RAY_VERSION" "$TORCH_VERSION" "$NUMPY_VERSION" <<'PY' >/dev/null 2>&1
import sys
from importlib.metadata import version
ok = (version("ray"), version("torch"), version("numpy")) == tuple(sys.argv[1:4])
# Present only with the [train] extra.
version("pyarrow"), version("fsspec")
sys.exit(0 if ok else 1)
PY
}

if installed; then
    echo "$venv: ray[train] $RAY_VERSION, torch $TORCH_VERSION, numpy $NUMPY_VERSION already installed"
    exit 0
fi

if [[ ! -x "$py" ]]; then
    mkdir -p "$(dirname "$venv")"
    timeout 300 python3 -m venv "$venv"
fi
timeout 300 "$py" -m pip install --quiet --disable-pip-version-check --upgrade pip
timeout 1800 "$py" -m pip install --quiet --disable-pip-version-check \
    "ray[train]==$RAY_VERSION" "torch==$TORCH_VERSION" "numpy==$NUMPY_VERSION"

if ! installed; then
    echo "bench/ray/setup_train.sh: $venv does not hold ray[train] $RAY_VERSION, torch $TORCH_VERSION and numpy $NUMPY_VERSION" >&2
    exit 1
fi
echo "$venv: installed ray[train] $RAY_VERSION, torch $TORCH_VERSION, numpy $NUMPY_VERSION"
