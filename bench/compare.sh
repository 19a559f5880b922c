#!/usr/bin/env bash
# Prism vs Ray on this machine, in one command: builds Prism's microbenchmark,
# installs Ray's side (bench/ray/setup.sh), runs the two sides alternately,
# N times each, and prints a Markdown table of the medians.
#
#   bench/compare.sh [--runs N] [--quick] [--no-build] [--out DIR]
#   bench/compare.sh --table DIR     (the table again, from a run's raw outputs)
#
#   --runs N    runs of each side (default 3)
#   --quick     smoke run: Prism with --quick; Ray with one `ray microbenchmark`
#               row (TESTS_TO_RUN, unless set) and fewer extra rounds
#   --no-build  use the Prism binary already built
#   --out DIR   where raw outputs and the table go (default bench/results/<UTC time>)
#   --table DIR print the table of the runs saved in DIR; runs nothing
#
# TESTS_TO_RUN / TESTS_TO_SKIP (Ray's own filters) pass through to Ray's side.
# A full run takes about 15 minutes a round on a 2-core machine, nearly all
# of it Ray's: run it on a quiet machine.
set -euo pipefail

runs=3
quick=0
build=1
out=""
table_only=0
while (($#)); do
    case "$1" in
        --runs) runs="${2:?--runs needs a number}"; shift 2 ;;
        --runs=*) runs="${1#--runs=}"; shift ;;
        --quick) quick=1; shift ;;
        --no-build) build=0; shift ;;
        --out) out="${2:?--out needs a folder}"; shift 2 ;;
        --table) out="${2:?--table needs a folder}"; table_only=1; shift 2 ;;
        -h|--help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "compare.sh: unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
done
[[ "$runs" =~ ^[1-9][0-9]*$ ]] || { echo "compare.sh: --runs needs a positive number" >&2; exit 2; }

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
out="${out:-bench/results/$(date -u +%Y%m%dT%H%M%SZ)}"
if ((table_only)); then
    [[ -f "$out/meta.env" ]] || { echo "compare.sh: $out holds no run (no meta.env)" >&2; exit 1; }
    runs="$(sed -n 's/^CMP_RUNS=//p' "$out/meta.env")"
else
    mkdir -p "$out"
    echo "compare.sh: raw outputs in $out" >&2

    # Seconds allowed for one run of each side (Ray's full benchmark: ~13 min here).
    prism_limit=1200
    ray_limit=2700
    if ((quick)); then
        prism_limit=600
        ray_limit=900
    fi

    # --- Prism's side -----------------------------------------------------------
    if ((build)); then
        echo "compare.sh: cargo build --release --example microbenchmark" >&2
        timeout 3600 cargo build --release --example microbenchmark >"$out/build.log" 2>&1 || {
            tail -30 "$out/build.log" >&2
            echo "compare.sh: build failed (log: $out/build.log)" >&2
            exit 1
        }
    fi
    target_dir="${CARGO_TARGET_DIR:-}"
    if [[ -z "$target_dir" ]]; then
        target_dir="$(timeout 300 cargo metadata --format-version 1 --no-deps |
            python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')"
    fi
    prism_bin="$target_dir/release/examples/microbenchmark"
    [[ -x "$prism_bin" ]] || { echo "compare.sh: no binary at $prism_bin" >&2; exit 1; }

    # --- Ray's side ---------------------------------------------------------------
    timeout 1800 bash bench/ray/setup.sh >&2
    ray_python="$root/bench/ray/.venv/bin/python"

    # Runs a command in its own process group with a time limit; afterwards ends
    # whatever is left in that group (by its id). Returns the command's status.
    run_bounded() {
        local limit="$1" stdout="$2" stderr="$3"
        shift 3
        setsid "$@" >"$stdout" 2>"$stderr" </dev/null &
        local pid=$! waited=0 rc=0
        while kill -0 "$pid" 2>/dev/null && ((waited < limit)); do
            sleep 1
            waited=$((waited + 1))
        done
        if kill -0 "$pid" 2>/dev/null; then
            echo "compare.sh: $1 ran past ${limit} s: stopping it" >&2
            kill -TERM -- "-$pid" 2>/dev/null || true
            for _ in $(seq 30); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
            kill -KILL -- "-$pid" 2>/dev/null || true
        fi
        wait "$pid" || rc=$?
        kill -TERM -- "-$pid" 2>/dev/null || true
        return "$rc"
    }

    prism_args=()
    ray_args=()
    if ((quick)); then
        prism_args+=(--quick)
        ray_args+=(--quick)
        # One row of Ray's benchmark (about 25 s) unless a subset was chosen.
        [[ -n "${TESTS_TO_RUN+set}" ]] || export TESTS_TO_RUN="single client tasks sync"
    fi

    # What the table's header states, taken before the runs.
    mem_total="$(free -g | awk '/^Mem:/ {print $2}')"
    cpu_model="$(awk -F': *' '/^model name/ {print $2; exit}' /proc/cpuinfo)"
    {
        echo "CMP_DATE=$(date -u '+%Y-%m-%d %H:%M UTC')"
        echo "CMP_RUNS=$runs"
        echo "CMP_MODE=$( ((quick)) && echo 'quick (smoke run: not for publishing)' || echo full)"
        echo "CMP_FILTER=${TESTS_TO_RUN:-}"
        echo "CMP_COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet HEAD -- 2>/dev/null || echo ' (with uncommitted changes)')"
        echo "CMP_MACHINE=$(nproc) cores, ${mem_total} GiB memory (free -g), Linux $(uname -r), ${cpu_model:-unknown CPU}"
        echo "CMP_VERSIONS=$(rustc --version 2>/dev/null || echo 'rustc ?'); $(timeout 120 "$ray_python" -c '
import platform
from importlib.metadata import version
print("ray %s, numpy %s, Python %s" % (version("ray"), version("numpy"), platform.python_version()))')"
    } >"$out/meta.env"
    timeout 120 "$ray_python" -m pip freeze >"$out/ray-venv-freeze.txt" 2>/dev/null || true

    for ((i = 1; i <= runs; i++)); do
        echo "compare.sh: round $i/$runs: Prism" >&2
        run_bounded "$prism_limit" "$out/prism.$i.txt" "$out/prism.$i.err" \
            "$prism_bin" ${prism_args[@]+"${prism_args[@]}"} ||
            echo "compare.sh: Prism run $i failed (exit $?; see $out/prism.$i.err)" >&2
        echo "compare.sh: round $i/$runs: Ray" >&2
        run_bounded "$ray_limit" "$out/ray.$i.txt" "$out/ray.$i.err" \
            python3 bench/ray/ray_side.py --raw "$out/ray.$i.raw.log" ${ray_args[@]+"${ray_args[@]}"} ||
            echo "compare.sh: Ray run $i incomplete (exit $?; see $out/ray.$i.err)" >&2
    done
fi

# --- the table -------------------------------------------------------------------
python3 - "$out" "$runs" >"$out/table.md" <<'PY'
import glob, os, re, statistics, sys

out, runs = sys.argv[1], int(sys.argv[2])
meta = {}
with open(os.path.join(out, "meta.env")) as f:
    for line in f:
        key, _, value = line.rstrip("\n").partition("=")
        meta[key] = value

ORDER = [
    "single_client_get_calls", "single_client_put_calls", "multi_client_put_calls",
    "single_client_put_gigabytes", "single_client_tasks_and_get_batch",
    "multi_client_put_gigabytes", "single_client_get_object_containing_10k_refs",
    "single_client_wait_1k_refs", "single_client_tasks_sync", "single_client_tasks_async",
    "multi_client_tasks_async", "1_1_actor_calls_sync", "1_1_actor_calls_async",
    "1_1_actor_calls_concurrent", "1_n_actor_calls_async", "n_n_actor_calls_async",
    "n_n_actor_calls_with_arg_async", "1_1_async_actor_calls_sync",
    "1_1_async_actor_calls_async", "placement_group_create_removal",
    "cluster_start", "cluster_shutdown", "first_task_latency",
    "actor_creation_plus_first_call", "get_100mb_in_worker_ms", "put_100mb_random_gigabytes",
    "idle_node_processes", "idle_node_pss",
]
NOT_IN_PRISM = set()
UNITS = {n: "per_s" for n in ORDER[:20]}
UNITS.update(single_client_put_gigabytes="GB_per_s", multi_client_put_gigabytes="GB_per_s",
             cluster_start="ms", cluster_shutdown="ms", first_task_latency="ms",
             actor_creation_plus_first_call="ms", get_100mb_in_worker_ms="ms",
             put_100mb_random_gigabytes="GB_per_s", idle_node_processes="processes",
             idle_node_pss="MiB")
ROW = re.compile(r"^([A-Za-z0-9_]+) ([-+0-9.eE]+|nan|inf) ([A-Za-z_]+)$")


def load(side):
    values, units, nfiles = {}, {}, 0
    for path in sorted(glob.glob(os.path.join(out, f"{side}.*.txt"))):
        if not re.fullmatch(rf"{side}\.\d+\.txt", os.path.basename(path)):
            continue
        nfiles += 1
        with open(path, errors="replace") as f:
            for line in f:
                m = ROW.match(line.strip())
                if m:
                    values.setdefault(m[1], []).append(float(m[2]))
                    units.setdefault(m[1], m[3])
    return values, units, nfiles


prism, prism_units, prism_files = load("prism")
ray, ray_units, ray_files = load("ray")
names = [n for n in ORDER] + sorted((set(prism) | set(ray)) - set(ORDER))


def fmt(v):
    a = abs(v)
    if v == int(v) and a < 1e6:
        return f"{int(v):,}"
    if a >= 100:
        return f"{v:,.0f}"
    if a >= 10:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.2f}"
    return f"{v:.3g}"


def cell(values, name, missing="—"):
    vs = values.get(name)
    if not vs:
        return missing, None
    med = statistics.median(vs)
    text = fmt(med)
    if len(vs) < runs:
        text += f" ({len(vs)}/{runs} runs)"
    return text, med


def higher_is_better(unit):
    return unit.endswith("per_s")


print("# Prism vs Ray microbenchmark")
print()
print(f"- Measured: {meta.get('CMP_DATE', '?')}, Prism at {meta.get('CMP_COMMIT', '?')}")
print(f"- Mode: {meta.get('CMP_MODE', '?')}; {runs} run(s) of each side, alternating; medians"
      + (f"; Ray TESTS_TO_RUN={meta['CMP_FILTER']!r}" if meta.get("CMP_FILTER") else ""))
print(f"- Machine: {meta.get('CMP_MACHINE', '?')}")
print(f"- Versions: {meta.get('CMP_VERSIONS', '?')}")
print("- Ratio: how many times better Prism is: Prism/Ray for rates (per_s, GB_per_s: higher is "
      "better), Ray/Prism for ms, MiB and processes (lower is better). Above 1: Prism is better.")
print("- single_client_put_gigabytes and multi_client_put_gigabytes count a GB as 1000 x 2^20 "
      "bytes on both sides, as Ray's benchmark does; put_100mb_random_gigabytes counts 10^9 bytes. "
      "— = no figure printed; n/a = not implemented in Prism yet.")
print()
print("| metric | unit | Prism median | Ray median | Prism/Ray ratio |")
print("| --- | --- | ---: | ---: | ---: |")
for name in names:
    pu, ru = prism_units.get(name), ray_units.get(name)
    unit = pu or ru or UNITS.get(name, "")
    ptext, p = cell(prism, name, "n/a" if name in NOT_IN_PRISM else "—")
    rtext, r = cell(ray, name)
    if pu and ru and pu != ru:
        ratio = f"units differ ({pu} vs {ru})"
    elif p is None or r is None:
        ratio = "—"
    elif higher_is_better(unit):
        ratio = fmt(p / r) + "x" if r > 0 else "—"
    else:
        ratio = fmt(r / p) + "x" if p > 0 else "—"
    print(f"| {name} | {unit} | {ptext} | {rtext} | {ratio} |")
print()
print(f"Raw outputs: {out} ({prism_files} Prism and {ray_files} Ray runs).")
PY
cat "$out/table.md"
