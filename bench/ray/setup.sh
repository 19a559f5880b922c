#!/usr/bin/env bash
# Installs Ray's side of the benchmark into bench/ray/.venv, pinned.
# Idempotent: does nothing when the venv already holds the pinned versions.
#
# ray[default] is the install Ray's documentation gives: it brings the
# dashboard and its agents (part of every node a user starts, and of the idle
# node's process count and memory) and grpcio, which `ray microbenchmark`
# imports for its Ray Client section.
set -euo pipefail

RAY_VERSION=2.60.0
NUMPY_VERSION=2.4.6

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="$here/.venv"
py="$venv/bin/python"

installed() {
    [[ -x "$py" ]] || return 1
    timeout 120 "$py" - "$RAY_VERSION" "$NUMPY_VERSION" <<'PY' >/dev/null 2>&1
import sys
from importlib.metadata import version
ok = (version("ray"), version("numpy")) == (sys.argv[1], sys.argv[2])
# Present only with the [default] extra.
version("grpcio"), version("aiohttp")
sys.exit(0 if ok else 1)
PY
}

if installed; then
    echo "bench/ray/.venv: ray $RAY_VERSION, numpy $NUMPY_VERSION already installed"
    exit 0
fi

if [[ ! -x "$py" ]]; then
    timeout 300 python3 -m venv "$venv"
fi
timeout 300 "$py" -m pip install --quiet --disable-pip-version-check --upgrade pip
timeout 1200 "$py" -m pip install --quiet --disable-pip-version-check \
    "ray[default]==$RAY_VERSION" "numpy==$NUMPY_VERSION"

if ! installed; then
    echo "bench/ray/setup.sh: venv does not hold ray[default] $RAY_VERSION and numpy $NUMPY_VERSION" >&2
    exit 1
fi
echo "bench/ray/.venv: installed ray $RAY_VERSION, numpy $NUMPY_VERSION"
