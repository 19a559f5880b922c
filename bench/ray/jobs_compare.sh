#!/usr/bin/env bash
# Jobs, Prism against Ray 2.60, measured the same way in one run: each side
# starts a head on this machine (2 CPUs, token auth on), then
#  - `<cli> job submit -- echo hello` end to end, --runs times (the CLI's
#    whole run: version check, submit, log tail, status);
#  - bench/ray/jobs_bench.py against its REST routes: submit, submit to
#    RUNNING, submit to SUCCEEDED, and --jobs jobs at once with the
#    machine's memory growth per running job.
# Prints a Markdown table of min / median / max.
#
#   bench/ray/jobs_compare.sh [--runs N] [--jobs N] [--no-build]
#
# Installs Ray with bench/ray/setup.sh.
set -euo pipefail

runs=10
jobs=100
build=1
while (($#)); do
    case "$1" in
        --runs) runs="${2:?--runs needs a number}"; shift 2 ;;
        --jobs) jobs="${2:?--jobs needs a number}"; shift 2 ;;
        --no-build) build=0; shift ;;
        -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "jobs_compare.sh: unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
done
for n in "$runs" "$jobs"; do
    [[ "$n" =~ ^[0-9]+$ && "$n" -gt 0 ]] || { echo "jobs_compare.sh: '$n' is not a positive count" >&2; exit 2; }
done

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
target="${CARGO_TARGET_DIR:-$root/target}"
if ((build)); then
    cargo build --release -p prism-cli
fi
bash bench/ray/setup.sh >/dev/null
venv="$root/bench/ray/.venv/bin"
prism="$target/release/prism"
work="$(mktemp -d /tmp/prism-jobs-bench.XXXXXX)"
ray_port=28265

cleanup() {
    "$prism" stop --force --temp-dir "$work/prism" >/dev/null 2>&1 || true
    RAY_AUTH_MODE=token "$venv/ray" stop --force >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT

# Milliseconds of `"$@"`, --runs times: "min median max".
timed() {
    local out="" t0 t1
    for _ in $(seq "$runs"); do
        t0=$(date +%s%N)
        "$@" >/dev/null 2>&1 || { echo "jobs_compare.sh: '$*' failed" >&2; exit 1; }
        t1=$(date +%s%N)
        out+="$(( (t1 - t0) / 1000000 ))"$'\n'
    done
    sort -n <<<"$out" | awk 'NF { v[n++] = $1 } END { printf "%s %s %s\n", v[0], v[int((n - 1) / 2)], v[n - 1] }'
}

# Prism.
"$prism" start --head --port 0 --dashboard-port 0 --num-cpus 2 --node-ip-address 127.0.0.1 \
    --temp-dir "$work/prism" >/dev/null
prism_url="http://$("$venv/python" -c 'import glob, json, sys
print(next(json.load(open(f))["dashboard"] for f in glob.glob(sys.argv[1] + "/nodes/*.json")))' "$work/prism")"
prism_token="$(cat "$work/prism/token")"
prism_cli="$(timed "$prism" job --temp-dir "$work/prism" submit -- echo hello)"
prism_rest="$("$venv/python" bench/ray/jobs_bench.py --address "$prism_url" --token "$prism_token" --runs "$runs" --jobs "$jobs")"
"$prism" stop --temp-dir "$work/prism" >/dev/null

# Ray, with token authentication on (its default in 2.60).
ray_token="$("$venv/python" -c 'import secrets; print(secrets.token_hex(32))')"
export RAY_AUTH_MODE=token RAY_AUTH_TOKEN="$ray_token"
"$venv/ray" start --head --num-cpus 2 --dashboard-port "$ray_port" --disable-usage-stats \
    --temp-dir "$work/ray" >/dev/null 2>&1
ray_url="http://127.0.0.1:$ray_port"
ray_cli="$(RAY_ADDRESS="$ray_url" timed "$venv/ray" job submit -- echo hello)"
ray_rest="$("$venv/python" bench/ray/jobs_bench.py --address "$ray_url" --token "$ray_token" --runs "$runs" --jobs "$jobs")"
"$venv/ray" stop --force >/dev/null 2>&1 || true
unset RAY_AUTH_MODE RAY_AUTH_TOKEN

row() { # name prism "min med max" ray "min med max"
    awk -v n="$1" -v p="$2" -v r="$3" 'BEGIN {
        split(p, a, " "); split(r, b, " ");
        ratio = (a[2] > 0) ? sprintf("%.0fx", b[2] / a[2]) : "-";
        printf "| %s | %s (%s-%s) | %s (%s-%s) | %s |\n", n, a[2], a[1], a[3], b[2], b[1], b[3], ratio }'
}
pick() { awk -v n="$1" '$1 == n { print $2, $3, $4 }' <<<"$2"; }
echo "| jobs, median (min-max) | Prism | Ray 2.60 | Ray / Prism |"
echo "|---|---|---|---|"
row "cli_submit_echo_hello_ms" "$prism_cli" "$ray_cli"
for name in submit_ms to_running_ms to_succeeded_ms jobs_all_running_s head_pss_per_running_job_mb; do
    row "$name" "$(pick "$name" "$prism_rest")" "$(pick "$name" "$ray_rest")"
done
