#!/usr/bin/env bash
# Prism's training examples and the same trainings with Ray Train's
# TorchTrainer, side by side on this machine: runs them alternately and
# prints a Markdown table of wall time, time per epoch, final loss or test
# accuracy, and the peak process count and memory of each run.
#
#   bench/ray/train_compare.sh [options]
#   bench/ray/train_compare.sh --table DIR   (the table again, from saved runs)
#
#   --runs N         runs of each linear-regression side (default 2)
#   --fmnist-runs N  runs of each fashion-mnist side (default 1; 0 skips it)
#   --workers "A B"  linear-regression worker counts (default "3 2": 3 is the
#                    example's default, 2 matches Ray's figures in docs)
#   --epochs N       linear-regression epochs (default 200)
#   --v2-runs N      runs of Ray Train V2 with its poll shortened (default 1)
#   --poll S         that shortened poll, seconds (default 0.2)
#   --v2-default     also run Train V2 as installed (2 s poll) once per
#                    linear-regression worker count: about 7 minutes a run
#   --v2-default-workers N   only for this worker count
#   --no-v1          skip the legacy trainer (Train V1)
#   --no-build       use the Prism examples already built
#   --out DIR        where raw outputs and the table go
#                    (default bench/results/train-<UTC time>)
#
# Systems in the table:
#   prism            train/examples/{linear_regression,fashion_mnist}.rs
#   ray-train-v1     RAY_TRAIN_V2_ENABLED=0, trainer_resources={"CPU": 0}
#   ray-train-v2     Ray's default trainer, RAY_TRAIN_HEALTH_CHECK_INTERVAL_S=--poll
#   ray-train-v2-default   Ray's default trainer and poll (2 s)
# bench/ray/train_ray.py is Ray's side; bench/ray/setup_train.sh installs it.
#
# Every run is started by a small launcher that is the child subreaper of
# what it starts (Ray's daemons stay in its tree), samples the run's process
# tree every 0.5 s (count, and PSS summed from /proc/<pid>/smaps_rollup),
# times the whole process (imports and shutdown included) and afterwards ends
# every leftover process by its pid. The sampling takes about a sixth of a
# core while Ray's ~15 processes run. Run it on a quiet machine: the default
# set takes about 17 minutes on 2 cores, 24 with --v2-default-workers 2.
set -euo pipefail

runs=2
fmnist_runs=1
workers_list="3 2"
epochs=200
v2_runs=1
poll=0.2
v2_default=0
v2_default_workers=""
v1=1
build=1
out=""
table_only=0
while (($#)); do
    case "$1" in
        --runs) runs="${2:?--runs needs a number}"; shift 2 ;;
        --fmnist-runs) fmnist_runs="${2:?--fmnist-runs needs a number}"; shift 2 ;;
        --workers) workers_list="${2:?--workers needs worker counts}"; shift 2 ;;
        --epochs) epochs="${2:?--epochs needs a number}"; shift 2 ;;
        --v2-runs) v2_runs="${2:?--v2-runs needs a number}"; shift 2 ;;
        --poll) poll="${2:?--poll needs seconds}"; shift 2 ;;
        --v2-default) v2_default=1; shift ;;
        --v2-default-workers) v2_default=1; v2_default_workers="${2:?--v2-default-workers needs a number}"; shift 2 ;;
        --no-v1) v1=0; shift ;;
        --no-build) build=0; shift ;;
        --out) out="${2:?--out needs a folder}"; shift 2 ;;
        --table) out="${2:?--table needs a folder}"; table_only=1; shift 2 ;;
        -h|--help) sed -n '2,38p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "train_compare.sh: unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
done
for n in "$runs" "$fmnist_runs" "$v2_runs" "$epochs"; do
    [[ "$n" =~ ^[0-9]+$ ]] || { echo "train_compare.sh: '$n' is not a count" >&2; exit 2; }
done

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
out="${out:-bench/results/train-$(date -u +%Y%m%dT%H%M%SZ)}"
mkdir -p "$out"

# --- the launcher: runs one command, samples its tree, times it ---------------

# --- the table ------------------------------------------------------------------
print_table() {
    python3 - "$out" <<'PY'
import glob, os, statistics, sys
out = sys.argv[1]
rows = {}
for path in sorted(glob.glob(os.path.join(out, "*.kv"))):
    kv = {}
    with open(path) as f:
        for line in f:
            key, _, value = line.strip().partition(" ")
            kv[key] = value
    rows.setdefault((kv["workload"], int(kv["workers"]), kv["system"]), []).append(kv)
order = {"prism": 0, "ray-train-v1": 1, "ray-train-v2": 2, "ray-train-v2-default": 3}
def median(runs, key):
    values = []
    for kv in runs:
        try:
            values.append(float(kv[key]))
        except (KeyError, ValueError):
            pass
    return statistics.median(values) if values else None
def fmt(value, spec, unit=""):
    return "—" if value is None else f"{value:{spec}}{unit}"
print("| workload | workers | system | runs ok | wall time | time per epoch | steady epoch | final loss | test accuracy | process wall | peak processes | peak PSS | wall vs Prism |")
print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for key in sorted(rows, key=lambda k: (k[0] != "linear-regression", -k[1], order.get(k[2], 9))):
    workload, workers, system = key
    runs = rows[key]
    ok = [kv for kv in runs if kv.get("rc") == "0"]
    use = ok or runs
    wall = median(use, "wall_s")
    prism = rows.get((workload, workers, "prism"))
    prism_wall = median([kv for kv in prism if kv.get("rc") == "0"] or prism, "wall_s") if prism else None
    ratio = f"{wall / prism_wall:.1f}×" if wall and prism_wall else "—"
    if system == "prism":
        ratio = "1.0×"
    extra = ""
    poll = use[0].get("poll_s")
    if system.startswith("ray-train-v2") and poll:
        extra = f" (poll {poll.split()[0]} s)"
    acc = median(use, "val_accuracy")
    print(f"| {workload} | {workers} | {system}{extra} | {len(ok)}/{len(runs)} "
          f"| {fmt(wall, '.1f', ' s')} | {fmt(median(use, 'per_epoch_ms'), '.0f', ' ms')} "
          f"| {fmt(median(use, 'steady_epoch_ms'), '.0f', ' ms')} "
          f"| {fmt(median(use, 'loss'), '.3g')} "
          f"| {fmt(None if acc is None else 100 * acc, '.2f', '%')} "
          f"| {fmt(median(use, 'process_wall_s'), '.1f', ' s')} "
          f"| {fmt(median(use, 'peak_processes'), '.0f')} "
          f"| {fmt(median(use, 'peak_pss_mib'), ',.0f', ' MiB')} | {ratio} |")
PY
}

if ((table_only)); then
    [[ -f "$out/machine.md" ]] && cat "$out/machine.md"
    print_table
    exit 0
fi
echo "train_compare.sh: raw outputs in $out" >&2

# --- Prism's side ---------------------------------------------------------------
torch_env="$HOME/.cache/prism/torch-2.11.0/prism-torch.env"
target_dir="${CARGO_TARGET_DIR:-$HOME/.cache/prism/target}"
if ((build)); then
    timeout 1800 bash scripts/setup-torch.sh >"$out/setup-torch.log" 2>&1 || {
        tail -20 "$out/setup-torch.log" >&2; exit 1; }
    echo "train_compare.sh: cargo build --release -p prism-train --features tch (examples)" >&2
    (
        # shellcheck disable=SC1090
        . "$torch_env"
        CARGO_TARGET_DIR="$target_dir" timeout 3600 cargo build --release -p prism-train \
            --features tch --example linear_regression --example fashion_mnist
    ) >"$out/build.log" 2>&1 || {
        tail -30 "$out/build.log" >&2
        echo "train_compare.sh: build failed (log: $out/build.log)" >&2
        exit 1
    }
fi
examples="$target_dir/release/examples"
for bin in linear_regression fashion_mnist; do
    [[ -x "$examples/$bin" ]] || {
        echo "train_compare.sh: no binary at $examples/$bin (run without --no-build, or set CARGO_TARGET_DIR)" >&2
        exit 1
    }
done
if ((fmnist_runs > 0)); then
    data="$(bash scripts/fetch-dataset.sh fashion-mnist | tail -1)"
fi

# --- Ray's side -------------------------------------------------------------------
timeout 1800 bash bench/ray/setup_train.sh >&2
ray_venv="${PRISM_RAY_TRAIN_VENV:-$HOME/.cache/prism/ray-train-2.60.0}"
ray_python="$ray_venv/bin/python"

# --- machine and versions ---------------------------------------------------------
{
    echo "Machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo)," \
        "$(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1), Linux $(uname -r)."
    echo "Prism $(git rev-parse --short HEAD) (libtorch 2.11.0 through tch, $(rustc --version | cut -d' ' -f1-2));" \
        "$("$ray_python" -c 'import ray, torch, sys; print(f"Ray {ray.__version__}, PyTorch {torch.__version__}, Python {sys.version.split()[0]}")' 2>/dev/null)."
    echo
} >"$out/machine.md"
"$ray_python" -m pip freeze --disable-pip-version-check >"$out/ray-train-venv-freeze.txt" 2>/dev/null || true
cat "$out/machine.md" >&2

# run WORKLOAD WORKERS SYSTEM ROUND LIMIT_S -- CMD...
run() {
    local workload="$1" workers="$2" system="$3" round="$4" limit="$5"
    shift 6
    local base="$out/$workload-w$workers-$system-$round"
    printf 'workload %s\nworkers %s\nsystem %s\n' "$workload" "$workers" "$system" >"$base.kv"
    echo "train_compare.sh: $workload, $workers workers, $system, run $round" >&2
    python3 "$root/bench/ray/measure.py" "$base.kv" "$limit" "$base.stdout" "$base.stderr" -- "$@" || true
    if [[ "$system" == prism ]]; then
        # The examples' summary table and their progress lines.
        python3 - "$base.stdout" "$base.stderr" >>"$base.kv" <<'PY'
import re, sys
table = open(sys.argv[1]).read()
def cell(name):
    m = re.search(r"^\| " + re.escape(name) + r"\s*\| ([^|]*?)\s*\|", table, re.M)
    return m.group(1) if m else None
if cell("wall time"):
    print("wall_s", cell("wall time").split()[0])
    print("per_epoch_ms", cell("time per epoch").split()[0])
    print("reports", cell("reports"))
if cell("final loss"):
    print("loss", cell("final loss"))
if cell("test accuracy"):
    print("val_accuracy", float(cell("test accuracy").rstrip("%")) / 100)
marks = re.findall(r"^epoch (\d+)/\d+ .*?([0-9.]+) s$", open(sys.argv[2]).read(), re.M)
if len(marks) > 1:
    (e0, t0), (e1, t1) = marks[0], marks[-1]
    if int(e1) > int(e0):
        print("steady_epoch_ms", f"{1000 * (float(t1) - float(t0)) / (int(e1) - int(e0)):.1f}")
run = cell("run folder")
if run and run.startswith("/tmp/prism_results/"):
    import shutil
    shutil.rmtree(run, ignore_errors=True)
PY
    else
        # train_ray.py's `key value` lines (Ray Tune prints its tables on stdout too).
        grep -E '^(ray_version|torch_version|epochs|poll_s|reports|import_s|init_s|fit_s|wall_s|per_epoch_ms|steady_epoch_ms|shutdown_s|loss|val_accuracy) ' \
            "$base.stdout" >>"$base.kv" || true
    fi
    local rc
    rc="$(sed -n 's/^rc //p' "$base.kv")"
    [[ "$rc" == 0 ]] || echo "train_compare.sh: $base exited with $rc (see $base.stderr)" >&2
}

prism_storage="$(mktemp -d /tmp/prism-train-compare.XXXXXX)"
trap 'rm -rf "$prism_storage"' EXIT

# Linear regression: the sides alternate within each round.
for workers in $workers_list; do
    for ((r = 1; r <= runs || r <= v2_runs; r++)); do
        if ((r <= runs)); then
            run linear-regression "$workers" prism "$r" 900 -- \
                "$examples/linear_regression" --workers "$workers" --epochs "$epochs" --storage "$prism_storage"
            if ((v1)); then
                run linear-regression "$workers" ray-train-v1 "$r" 1200 -- \
                    "$ray_python" bench/ray/train_ray.py linear-regression --trainer v1 \
                    --workers "$workers" --epochs "$epochs"
            fi
        fi
        if ((r <= v2_runs)); then
            run linear-regression "$workers" ray-train-v2 "$r" 1200 -- \
                "$ray_python" bench/ray/train_ray.py linear-regression --trainer v2 --poll "$poll" \
                --workers "$workers" --epochs "$epochs"
        fi
    done
    if ((v2_default)) && [[ -z "$v2_default_workers" || "$v2_default_workers" == "$workers" ]]; then
        run linear-regression "$workers" ray-train-v2-default 1 1800 -- \
            "$ray_python" bench/ray/train_ray.py linear-regression --trainer v2 \
            --workers "$workers" --epochs "$epochs"
    fi
done

# Fashion-MNIST, 2 workers, 4 epochs (the example's defaults).
for ((r = 1; r <= fmnist_runs; r++)); do
    run fashion-mnist 2 prism "$r" 900 -- "$examples/fashion_mnist" --workers 2 --ingest device --data "$data"
    if ((v1)); then
        run fashion-mnist 2 ray-train-v1 "$r" 1200 -- \
            "$ray_python" bench/ray/train_ray.py fashion-mnist --trainer v1 --workers 2 --data "$data"
    fi
    if ((r <= v2_runs)); then
        run fashion-mnist 2 ray-train-v2 "$r" 1200 -- \
            "$ray_python" bench/ray/train_ray.py fashion-mnist --trainer v2 --poll "$poll" \
            --workers 2 --data "$data"
    fi
done

{
    cat "$out/machine.md"
    print_table
    echo
    echo "Wall time: init + fit as each program times it (Prism: prism::init to the end of fit;"
    echo "Ray: ray.init() to the end of trainer.fit()); time per epoch = wall time / epochs;"
    echo "steady epoch: from the first epoch's report to the last, per epoch; process wall:"
    echo "the whole process, imports and shutdown included. Medians over the runs that passed."
} | tee "$out/table.md"
