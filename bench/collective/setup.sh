#!/usr/bin/env bash
# Creates bench/collective/.venv with torch (for its gloo backend) from PyPI.
#
# PyPI publishes only CUDA builds of torch for Linux x86_64, and `import
# torch` loads the CUDA libraries even to use gloo on CPU tensors, so the
# wheel's CUDA dependencies come along (several GB; no GPU is needed). The
# version is pinned so that figures stay comparable between runs.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="$here/.venv"
torch_version="${TORCH_VERSION:-2.13.0}"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
if ! "$venv/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$torch_version')" >/dev/null 2>&1; then
  "$venv/bin/pip" install --quiet --disable-pip-version-check "torch==$torch_version"
fi
"$venv/bin/python" -c "import torch, torch.distributed as dist; print('torch', torch.__version__, 'gloo', dist.is_gloo_available())"
