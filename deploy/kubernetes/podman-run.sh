#!/usr/bin/env bash
# Runs this folder's manifests as pods on this machine with `podman kube
# play`, and checks the cluster they make, step by step with each step's
# time:
#
#   1. the image (deploy/image/build.sh) is under 50 MB, and an application
#      image with the `pi` example is built on it;
#   2. a head pod and two worker pods form a cluster of three nodes; each
#      node's health probe answers (and the time from its container's start
#      is printed), and the control store's;
#   3. a job submitted from outside the pods (`prism job submit
#      --working-dir`) runs `pi` across the three pods and SUCCEEDS, and the
#      Job manifest's pod submits one the same way and exits 0;
#   4. a worker pod killed is marked DEAD, and started again it joins as a
#      new node;
#   5. the head pod killed and started again resumes its cluster: the job
#      history (on the state volume) and the workers are there.
#
#   bash deploy/kubernetes/podman-run.sh [--keep]
#
# Needs podman, buildah and a static busybox (Debian: apt-get install -y
# podman buildah runc busybox-static), run as root, and release builds of
# prism and the pi example:
#   cargo build --release -p prism-cli -p prism-examples --bin prism --example pi
# Which manifests podman plays, and why they are rendered first, is in
# podman.py. Everything it starts is removed at the end (--keep leaves the
# pods running; remove them with --down).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
export CONTAINERS_CONF="${CONTAINERS_CONF:-$repo/deploy/image/containers.conf}"
target="${CARGO_TARGET_DIR:-$repo/target}"
prism_bin="$target/release/prism"
pi_bin="$target/release/examples/pi"
venv="${PRISM_KUBE_VALIDATE_VENV:-$HOME/.cache/prism/kubernetes-validate}"
network=prism-kube
head_pod=prism-head-pod-0
workers=(prism-worker-cpu-pod-0 prism-worker-cpu-pod-1)
job_pod=prism-job-pi
started=$(date +%s.%N)

die() { echo "podman-run.sh: $*" >&2; exit 1; }
# Seconds from $1 (a `date +%s.%N`) to now.
secs_since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }'; }
say() { printf '[%6s s] %s\n' "$(secs_since "$started")" "$*"; }

down() {
    local pods=()
    for pod in "$job_pod" "${workers[@]}" "$head_pod"; do
        podman pod exists "$pod" 2>/dev/null && pods+=("$pod")
    done
    if [ ${#pods[@]} -gt 0 ]; then
        podman pod stop -t 5 "${pods[@]}" >/dev/null 2>&1 || true
        podman pod rm -f "${pods[@]}" >/dev/null 2>&1 || true
    fi
    podman secret rm prism-cluster-token >/dev/null 2>&1 || true
    podman volume rm -f prism-head-state >/dev/null 2>&1 || true
    podman network rm -f "$network" >/dev/null 2>&1 || true
}

keep=0
case "${1:-}" in
    --keep) keep=1 ;;
    --down) down; echo "removed"; exit 0 ;;
    "") ;;
    *) die "unknown argument $1 (--keep, --down)" ;;
esac
for tool in podman buildah python3 strip; do
    command -v "$tool" >/dev/null 2>&1 || die "$tool is missing (Debian: apt-get install -y podman buildah runc busybox-static binutils)"
done
[ -x "$prism_bin" ] && [ -x "$pi_bin" ] || die "no release build of prism and pi in $target (cargo build --release -p prism-cli -p prism-examples --bin prism --example pi)"
[ "$(id -u)" = 0 ] || die "run it as root (podman's pods here are root's)"

work="$(mktemp -d "${TMPDIR:-/tmp}/prism-kube.XXXXXX")"
finish() {
    local rc=$?
    if [ "$rc" != 0 ]; then
        echo "--- the head's log (last 40 lines)" >&2
        podman logs --tail 40 "$head_pod-prism" >&2 2>/dev/null || true
    fi
    [ "$keep" = 1 ] && [ "$rc" = 0 ] || down
    rm -rf "$work"
    exit "$rc"
}
trap finish EXIT
down

# The manifests are valid for Kubernetes, and podman's rendering of them.
bash "$here/validate.sh" >/dev/null
"$venv/bin/python" "$here/podman.py" --workers "${#workers[@]}" >"$work/cluster.yaml"
"$venv/bin/python" "$here/podman.py" --job >"$work/job.yaml"

# 1. The images.
bash "$repo/deploy/image/build.sh" --prism "$prism_bin" >/dev/null
bash "$repo/deploy/image/build-app.sh" --program "$pi_bin" >/dev/null
size=$(podman image inspect --format '{{.Size}}' localhost/prism:dev)
say "image localhost/prism:dev: $((size / 1000000)) MB (the limit: 50 MB)"
[ "$size" -lt 50000000 ] || die "the image is $size bytes, over 50 MB"

# The cluster's token, in the form podman reads for `secretKeyRef` (a JSON
# object of base64 values; Kubernetes' `kubectl create secret` makes the
# same Secret there).
token=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
printf '{"token":"%s"}' "$(printf %s "$token" | base64 -w0)" \
    | podman secret create prism-cluster-token - >/dev/null
podman network create "$network" >/dev/null
# The head's state volume (the claim's), writable by the image's user as
# Kubernetes' fsGroup makes it.
podman volume create prism-head-state >/dev/null
chown 1000:1000 "$(podman volume inspect --format '{{.Mountpoint}}' prism-head-state)"

ip_of() {
    podman inspect --format "{{(index .NetworkSettings.Networks \"$network\").IPAddress}}" "$1-prism"
}
# GET http://$1$2 with a 2 s limit: prints "STATUS BODY".
get() {
    python3 - "$1" "$2" <<'PY'
import sys, urllib.request, urllib.error
try:
    with urllib.request.urlopen(f"http://{sys.argv[1]}{sys.argv[2]}", timeout=2) as r:
        print(r.status, r.read().decode())
except urllib.error.HTTPError as e:
    print(e.code, e.read().decode())
except Exception as e:
    print(0, e)
PY
}
status() { podman exec "$head_pod-prism" prism status 2>/dev/null || true; }
# Kills pod $1 and waits (up to 30 s) until podman has it exited: a pod
# started while its kill is still under way is killed again.
kill_pod() {
    podman pod kill "$1" >/dev/null
    for _ in $(seq 1 300); do
        [ "$(podman pod inspect --format '{{.State}}' "$1")" = Exited ] && return 0
        sleep 0.1
    done
    die "pod $1 did not exit within 30 s of its kill"
}
# Starts a stopped pod and waits for its container to run. Now and then
# podman reports the pod started while its container is not running (it
# logs "container not running"); that is podman's failure, not Prism's,
# so the pod is started once more, and the log says so.
start_pod() {
    local try
    for try in 1 2; do
        podman pod start "$1" >/dev/null
        for _ in $(seq 1 100); do
            [ "$(podman inspect --format '{{.State.Running}}' "$1-prism" 2>/dev/null)" = true ] && return 0
            sleep 0.1
        done
        say "podman did not run $1's container within 10 s of starting the pod (try $try)"
    done
    die "podman could not start pod $1 again"
}
# Waits up to $1 seconds for `prism status` in the head pod to say $2.
wait_status() {
    local limit=$1 want=$2 i
    for i in $(seq 1 $((limit * 10))); do
        status | grep -q "$want" && return 0
        sleep 0.1
    done
    status >&2
    die "after $limit s the head's status does not say: $want"
}

# 2. The cluster.
played=$(date +%s.%N)
podman kube play --network "$network" "$work/cluster.yaml" >/dev/null
say "podman kube play: $head_pod and ${workers[*]}"
wait_status 30 "Nodes: 3 alive"
formed=$(secs_since "$played")
say "three nodes alive ${formed} s after podman kube play began (the target: 5 s)"
# Each pod's probe, asked every 20 ms from the moment podman started it:
# the time from its container's start to its first answer.
targets=()
for pod in "$head_pod" "${workers[@]}"; do
    targets+=("$pod" "$(ip_of "$pod")" "$(podman inspect --format '{{.State.StartedAt.UnixNano}}' "$pod-prism")")
done
python3 - "${targets[@]}" <<'PY' || die "a pod's health probe did not answer"
import sys, time, urllib.request
args = sys.argv[1:]
pods = [(args[i], args[i + 1], int(args[i + 2])) for i in range(0, len(args), 3)]
ready = {}
deadline = time.time() + 30
while len(ready) < len(pods) and time.time() < deadline:
    for name, ip, started in pods:
        if name in ready:
            continue
        try:
            with urllib.request.urlopen(f"http://{ip}:8080/api/local_raylet_healthz", timeout=1) as r:
                if r.status == 200 and r.read() == b"success":
                    ready[name] = time.time_ns()
        except Exception:
            pass
    time.sleep(0.02)
for name, ip, started in pods:
    if name not in ready:
        sys.exit(f"{name} ({ip}): no answer from its health probe in 30 s")
    print(f"{name} ({ip}): its probe answers 'success' by {(ready[name] - started) / 1e9:.2f} s after its container started")
PY
head_ip=$(ip_of "$head_pod")
[ "$(get "$head_ip:8265" /api/gcs_healthz)" = "200 success" ] || die "the control store's health probe does not answer"
say "the control store's probe answers at $head_ip:8265"

# 3. Jobs: one from outside the pods, one from the Job manifest's pod.
mkdir -p "$work/app"
cp "$pi_bin" "$work/app/pi"
strip --strip-all "$work/app/pi"
out="$work/job.out"
PRISM_AUTH_TOKEN="$token" timeout 120 "$prism_bin" job submit --address "http://$head_ip:8265" \
    --working-dir "$work/app" -- ./pi 360000000 12 >"$out" 2>&1 || { cat "$out" >&2; die "the job from outside did not succeed"; }
grep -q "on 3 CPUs" "$out" || { cat "$out" >&2; die "the job did not see the three pods' CPUs"; }
nodes=$(PRISM_AUTH_TOKEN="$token" "$prism_bin" list tasks --address "http://$head_ip:8265" --limit 1000 --format json \
    | python3 -c 'import json, sys; print(len({t["node_id"] for t in json.load(sys.stdin) if t.get("name", "").endswith("count_inside")}))')
say "a job from outside ran pi's tasks on $nodes nodes and SUCCEEDED: $(grep -m1 'pi ~=' "$out")"
[ "$nodes" = 3 ] || die "pi's tasks ran on $nodes nodes, not the 3 pods"
podman kube play --network "$network" "$work/job.yaml" >/dev/null
code=$(timeout 120 podman wait "$job_pod-submit" | tail -n1)
[ "$code" = 0 ] || { podman logs "$job_pod-submit" >&2; die "the Job's pod exited with $code"; }
say "the Job manifest's pod submitted pi and exited 0"
podman pod rm -f "$job_pod" >/dev/null

# 4. A worker pod dies, and comes back as a new node.
kill_pod "${workers[0]}"
wait_status 30 "Nodes: 2 alive, 1 dead"
say "${workers[0]} killed: the head marks its node DEAD"
start_pod "${workers[0]}"
wait_status 60 "Nodes: 3 alive, 1 dead"
say "${workers[0]} started again: it joins as a new node"

# 5. The head pod dies, and is started again on its state volume.
jobs_before=$(PRISM_AUTH_TOKEN="$token" "$prism_bin" job list --address "http://$head_ip:8265" | grep -c SUCCEEDED || true)
kill_pod "$head_pod"
start_pod "$head_pod"
restarted=$(date +%s.%N)
head_ip=$(ip_of "$head_pod")
for _ in $(seq 1 300); do
    [ "$(get "$head_ip:8265" /api/gcs_healthz)" = "200 success" ] && break
    sleep 0.1
done
[ "$(get "$head_ip:8265" /api/gcs_healthz)" = "200 success" ] || die "the head started again does not answer"
wait_status 60 "Nodes: 3 alive"
back=$(secs_since "$restarted")
jobs_after=$(PRISM_AUTH_TOKEN="$token" "$prism_bin" job list --address "http://$head_ip:8265" | grep -c SUCCEEDED || true)
say "the head pod killed and started again: 3 nodes alive after ${back} s; jobs SUCCEEDED before $jobs_before, after $jobs_after"
[ "$jobs_after" -ge "$jobs_before" ] && [ "$jobs_before" -ge 2 ] || die "the job history did not survive the head's restart"
status | sed 's/^/    /'
say "all checks passed"
