#!/usr/bin/env bash
# Prism's Fashion-MNIST search (tune/examples/tune_fashion_mnist.rs) and the
# same search with Ray Tune 2.60 (bench/ray/tune_ray.py), side by side:
# runs them alternately and prints a Markdown table of whole-process wall
# time, best validation accuracy, and the peak process count and memory
# (PSS summed over the process tree, sampled every 0.5 s by measure.py).
#
#   bench/ray/tune_compare.sh [--runs N] [--epochs N] [--samples N] [--no-build] [--out DIR]
#
# Both sides: 8 trials by default (4 samples of the space over 2 batch
# sizes), ASHA with max_t = epochs (4), grace period 1, reduction factor 2,
# one CPU per trial, a checkpoint every epoch, seed 7. Installs Ray's side
# with bench/ray/setup_train.sh and PyTorch for Prism's with
# scripts/setup-torch.sh; the dataset comes from scripts/fetch-dataset.sh.
set -euo pipefail

runs=1
epochs=4
samples=4
build=1
out=""
while (($#)); do
    case "$1" in
        --runs) runs="${2:?--runs needs a number}"; shift 2 ;;
        --epochs) epochs="${2:?--epochs needs a number}"; shift 2 ;;
        --samples) samples="${2:?--samples needs a number}"; shift 2 ;;
        --no-build) build=0; shift ;;
        --out) out="${2:?--out needs a folder}"; shift 2 ;;
        -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "tune_compare.sh: unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
done
for n in "$runs" "$epochs" "$samples"; do
    [[ "$n" =~ ^[0-9]+$ && "$n" -gt 0 ]] || { echo "tune_compare.sh: '$n' is not a positive count" >&2; exit 2; }
done

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
out="${out:-bench/results/tune-$(date -u +%Y%m%dT%H%M%SZ)}"
mkdir -p "$out"

bash scripts/fetch-dataset.sh fashion-mnist
bash bench/ray/setup_train.sh
ray_py="${PRISM_RAY_TRAIN_VENV:-$HOME/.cache/prism/ray-train-2.60.0}/bin/python"
bash scripts/setup-torch.sh
# shellcheck disable=SC1091
. "${PRISM_TORCH_VENV:-$HOME/.cache/prism/torch-2.11.0}/prism-torch.env"
if ((build)); then
    cargo build --release -p prism-tune --features tch --example tune_fashion_mnist
fi
prism_bin="${CARGO_TARGET_DIR:-$root/target}/release/examples/tune_fashion_mnist"

for ((i = 1; i <= runs; i++)); do
    for side in prism ray; do
        case "$side" in
            prism) cmd=("$prism_bin" --epochs "$epochs" --samples "$samples") ;;
            ray) cmd=("$ray_py" bench/ray/tune_ray.py --epochs "$epochs" --samples "$samples") ;;
        esac
        echo "== $side, run $i: ${cmd[*]}" >&2
        kv="$out/$side-$i.kv"
        : > "$kv"
        python3 bench/ray/measure.py "$kv" 1800 "$out/$side-$i.out" "$out/$side-$i.err" -- "${cmd[@]}"
        grep -Eo 'trials=[0-9]+ wall_s=[0-9.]+ best_accuracy=[0-9.]+' "$out/$side-$i.out" \
            | tr ' =' '\n ' | sed -n 's/^\(trials\|wall_s\|best_accuracy\) /\1 /p' >> "$kv" || true
    done
done

python3 - "$out" "$runs" <<'PY'
import statistics, sys
out, runs = sys.argv[1], int(sys.argv[2])
def kv(path):
    d = {}
    for line in open(path):
        k, _, v = line.strip().partition(" ")
        d[k] = v
    return d
rows = {s: [kv(f"{out}/{s}-{i}.kv") for i in range(1, runs + 1)] for s in ("prism", "ray")}
def med(side, key):
    vals = [float(r[key]) for r in rows[side] if key in r]
    return statistics.median(vals) if vals else float("nan")
for side in rows:
    for r in rows[side]:
        if r.get("rc") != "0":
            print(f"warning: a {side} run ended with rc {r.get('rc')}; see {out}", file=sys.stderr)
print(f"| metric | Prism | Ray Tune | Ray/Prism |")
print(f"| --- | ---: | ---: | ---: |")
for key, unit in [("process_wall_s", "s"), ("wall_s", "s"), ("peak_pss_mib", "MiB"), ("peak_processes", "")]:
    p, r = med("prism", key), med("ray", key)
    print(f"| {key} | {p:.2f} {unit} | {r:.2f} {unit} | {r / p:.1f}x |")
p, r = med("prism", "best_accuracy"), med("ray", "best_accuracy")
print(f"| best_accuracy | {100 * p:.2f}% | {100 * r:.2f}% | {100 * (p - r):+.2f} points |")
print(f"| trials | {med('prism', 'trials'):.0f} | {med('ray', 'trials'):.0f} | |")
PY
echo "raw outputs: $out" >&2
