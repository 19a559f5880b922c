#!/usr/bin/env bash
# Recovery after a SIGKILL, Prism (examples/recovery.rs) against Ray 2.60
# (bench/ray/recovery_ray.py), measured the same way in one run: a task
# whose worker is killed mid-run (time from the kill to its retried result)
# and an actor with unlimited restarts whose process is killed (time from
# the kill to its next answer). Prints a Markdown table of median (min-max)
# milliseconds over --runs kills per side.
#
#   bench/ray/recovery_compare.sh [--runs N] [--no-build]
#
# Installs Ray with bench/ray/setup_train.sh (the same pinned Ray as the
# Train and Tune comparisons).
set -euo pipefail

runs=5
build=1
while (($#)); do
    case "$1" in
        --runs) runs="${2:?--runs needs a number}"; shift 2 ;;
        --no-build) build=0; shift ;;
        -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "recovery_compare.sh: unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
done
[[ "$runs" =~ ^[0-9]+$ && "$runs" -gt 0 ]] || { echo "recovery_compare.sh: '$runs' is not a positive count" >&2; exit 2; }

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
target="${CARGO_TARGET_DIR:-$root/target}"
if ((build)); then
    cargo build --release --example recovery
fi
bash bench/ray/setup_train.sh >/dev/null
ray_py="${PRISM_RAY_TRAIN_VENV:-$HOME/.cache/prism/ray-train-2.60.0}/bin/python"

prism_out="$("$target/release/examples/recovery" --runs "$runs")"
ray_out="$("$ray_py" bench/ray/recovery_ray.py --runs "$runs" 2>/dev/null)"

cell() { # name output -> "median (min-max)"
    awk -v n="${1}_ms" '$1 == n { printf "%s (%s-%s)", $3, $2, $4 }' <<<"$2"
}
ratio() {
    local p r
    p="$(awk -v n="${1}_ms" '$1 == n { print $3 }' <<<"$2")"
    r="$(awk -v n="${1}_ms" '$1 == n { print $3 }' <<<"$3")"
    awk -v p="$p" -v r="$r" 'BEGIN { if (p > 0) printf "%.0fx", r / p; else print "-" }'
}
echo "| after a SIGKILL, ms | Prism | Ray 2.60 | Ray / Prism |"
echo "|---|---|---|---|"
for row in task_retry_after_kill actor_restart_after_kill; do
    echo "| $row | $(cell "$row" "$prism_out") | $(cell "$row" "$ray_out") | $(ratio "$row" "$prism_out" "$ray_out") |"
done
