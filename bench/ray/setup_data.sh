#!/usr/bin/env bash
# Installs Ray Data's side of the data-ingest comparison (data_compare.sh),
# pinned, into its own virtual environment:
#
#   bash bench/ray/setup_data.sh
#   "$HOME/.cache/prism/ray-data-2.60.0/bin/python" bench/ray/data_ray.py --help
#
# ray[data] is the install Ray Data's documentation gives (it brings pyarrow,
# pandas and fsspec); aiohttp is what fsspec needs for the path resolution
# read_parquet does. The environment lives outside the repository
# (PRISM_RAY_DATA_VENV to move it).
#
# Idempotent: does nothing when the environment already holds the pinned
# versions.
set -euo pipefail

RAY_VERSION=2.60.0
NUMPY_VERSION=2.4.6

venv="${PRISM_RAY_DATA_VENV:-$HOME/.cache/prism/ray-data-$RAY_VERSION}"
py="$venv/bin/python"

installed() {
    [[ -x "$py" ]] || return 1
    timeout 120 "$py" - "$RAY_VERSION" "$NUMPY_VERSION" <<'PY' >/dev/null 2>&1
import sys
from importlib.metadata import version
ok = (version("ray"), version("numpy")) == (sys.argv[1], sys.argv[2])
import pyarrow, ray.data
from fsspec.implementations.http import HTTPFileSystem
sys.exit(0 if ok else 1)
PY
}

if installed; then
    echo "$venv: ray[data] $RAY_VERSION, numpy $NUMPY_VERSION already installed"
    exit 0
fi

if [[ ! -x "$py" ]]; then
    timeout 300 python3 -m venv "$venv"
fi
timeout 300 "$py" -m pip install --quiet --disable-pip-version-check --upgrade pip
timeout 1200 "$py" -m pip install --quiet --disable-pip-version-check \
    "ray[data]==$RAY_VERSION" "numpy==$NUMPY_VERSION" aiohttp
installed || { echo "setup_data.sh: the install did not give ray[data] $RAY_VERSION" >&2; exit 1; }
echo "$venv: ray[data] $RAY_VERSION installed"
