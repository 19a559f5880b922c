#!/usr/bin/env bash
# Validates the manifests offline against Kubernetes' own schemas (strict:
# an unknown field fails), with kubernetes-validate from PyPI in a venv kept
# in a cache, for the versions named below; and checks that every file
# kustomization.yaml names exists and validates.
#
#   bash deploy/kubernetes/validate.sh
#
# podmonitor.yaml is a Prometheus Operator resource (a CRD): its schema is
# not Kubernetes', so it is only parsed.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="${PRISM_KUBE_VALIDATE_VENV:-$HOME/.cache/prism/kubernetes-validate}"
versions=(1.30.0 1.33.0)

if [ ! -x "$venv/bin/kubernetes-validate" ]; then
  echo "installing kubernetes-validate from PyPI into $venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q 'kubernetes-validate==1.*'
fi

# The files kustomization.yaml names, read with the venv's PyYAML.
mapfile -t listed < <("$venv/bin/python" - "$here/kustomization.yaml" <<'PY'
import sys, yaml
doc = yaml.safe_load(open(sys.argv[1]))
for name in doc.get("resources", []):
    print(name)
PY
)
[ "${#listed[@]}" -gt 0 ] || { echo "kustomization.yaml names no resources" >&2; exit 1; }
files=()
for name in "${listed[@]}"; do
  [ -f "$here/$name" ] || { echo "kustomization.yaml names $name, which does not exist" >&2; exit 1; }
  files+=("$here/$name")
done
files+=("$here/job.yaml")

for version in "${versions[@]}"; do
  echo "== Kubernetes $version, strict: ${files[*]##*/}"
  "$venv/bin/kubernetes-validate" --strict --quiet -k "$version" "${files[@]}"
done
"$venv/bin/python" -c 'import sys, yaml; list(yaml.safe_load_all(open(sys.argv[1])))' "$here/podmonitor.yaml"
echo "manifests valid"
