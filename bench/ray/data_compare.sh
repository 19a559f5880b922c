#!/usr/bin/env bash
# Data ingest, Prism against Ray Data, in one run on this machine:
# Fashion-MNIST's Parquet files read, scaled to float32 by map_batches, and
# consumed in batches of 128 (by the driver, then by two actors through
# streaming_split(2)). Both sides read the same files.
#
#   bash bench/ray/data_compare.sh [RUNS_PER_ROUND] [ROUNDS]   # defaults 5 and 2
#
# Installs what it needs (the Parquet files through
# scripts/fetch-dataset.sh --parquet, Ray Data through setup_data.sh),
# builds the Prism example, then alternates: each round runs Prism's
# example and Ray's script, each RUNS_PER_ROUND times in one process. Prints
# every run as JSON, then a table of the medians (the first run of each
# process, with its warm-up, included).
set -euo pipefail

runs="${1:-5}"
rounds="${2:-2}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$here"
data="$(bash scripts/fetch-dataset.sh fashion-mnist --parquet | tail -1)"
bash bench/ray/setup_data.sh >&2
py="${PRISM_RAY_DATA_VENV:-$HOME/.cache/prism/ray-data-2.60.0}/bin/python"
cargo build --release -q -p prism-data --example ingest
target="${CARGO_TARGET_DIR:-$here/target}"
out="$(mktemp)"
trap 'rm -f "$out"' EXIT
for round in $(seq 1 "$rounds"); do
    echo "== round $round: Prism" >&2
    timeout 600 "$target/release/examples/ingest" --data "$data" --runs "$runs" --json | tee -a "$out"
    echo "== round $round: Ray Data" >&2
    timeout 900 "$py" bench/ray/data_ray.py --data "$data" --runs "$runs" 2>/dev/null | tee -a "$out"
done
python3 - "$out" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
print()
print("| pipeline | Prism median s (min-max) | Ray Data median s (min-max) | Prism rows/s | Ray rows/s | Prism vs Ray |")
print("| --- | --- | --- | ---: | ---: | ---: |")
for pipeline in ("iter_batches", "streaming_split_2"):
    got = {}
    for system in ("prism", "ray"):
        s = [r["seconds"] for r in rows if r["system"] == system and r["pipeline"] == pipeline]
        got[system] = s
    if not all(got.values()):
        continue
    p, r = statistics.median(got["prism"]), statistics.median(got["ray"])
    n = next(x["rows"] for x in rows if x["pipeline"] == pipeline)
    print(f"| {pipeline} | {p:.3f} ({min(got['prism']):.3f}-{max(got['prism']):.3f}) "
          f"| {r:.3f} ({min(got['ray']):.3f}-{max(got['ray']):.3f}) "
          f"| {n / p:,.0f} | {n / r:,.0f} | {r / p:.1f}x |")
PY
