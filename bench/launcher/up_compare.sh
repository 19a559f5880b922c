#!/usr/bin/env bash
# Times Ray's cluster launcher (`ray up`, Ray's `local` provider over SSH)
# against Prism's (`prism up`, its `ssh` provider) on the same three test
# hosts, in the same run, alternating (prism, ray, prism, ray by default).
#
# The hosts are made as cli/tests/launcher.rs (`SshHosts::new`) makes them:
# four network namespaces on one bridge (the bridge in a namespace of its
# own), hosts 0-2 (10.88.0.1-3) each running Debian's sshd with its own
# private /tmp, /root and host name, host 3 (10.88.0.4) as the user's
# laptop, where `ray up` / `prism up` run (with a private /tmp too, so Ray's
# state files and SSH control sockets stay off this machine's /tmp). The
# keys are made here. Ray is not installed on the hosts: the start commands
# call it by absolute path in bench/ray/.venv (seen by every host); `prism
# up` copies its own binary to each host (once per build; the copy is kept
# by `prism down`, so rounds after the first copy nothing).
# Unlike the harness, each host also has its own PID namespace (`ray stop`
# kills by process name machine-wide), sees the venv's Python install
# (pyenv, under /root) read-only at its path, and has a ~/.bashrc putting
# the venv on PATH (`ray down` runs a plain `ray stop`); Ray's autoscaler v1
# is used (v2 never launched the second worker with the local provider;
# RAY_AUTOSCALER_V2=1 to try it).
#
# Measured (wall clock, `date +%s.%N` around each command):
#   prism up (3 nodes joined)  `prism up` returns once every node has joined
#   second prism up            nothing to change
#   prism down
#   ray up (returns)           `ray up -y` returns once the head runs
#   ray up until 3 nodes alive from the start of `ray up` until the GCS
#                              lists 3 nodes ALIVE (the autoscaler starts the
#                              workers over SSH after `ray up` returns);
#                              polled every 1 s through the dashboard's state
#                              API (`/api/v0/nodes`) from the laptop
#   second ray up              `ray up -y` again (Ray restarts Ray by default)
#   second ray up, 3 alive     until 3 nodes are ALIVE again after it
#   ray up --no-restart        `ray up -y --no-restart`
#   ray down                   `ray down -y`
# After each launcher's down, the processes left on hosts 0-2 (but sshd)
# are listed and killed before the next launcher runs.
#
# Run (as root): bash bench/launcher/up_compare.sh
# Needs: Ray from `bash bench/ray/setup.sh` (bench/ray/.venv), rsync
# (`apt-get install -y rsync`, Ray's `ray up` needs it on both sides),
# openssh-server/client, iproute2, util-linux (unshare, nsenter), curl.
# Environment: PRISM (default: the release build, target/release/prism or
# $CARGO_TARGET_DIR's; build it with `cargo build --release -p prism-cli
# --bin prism`), ROUNDS (default 2),
# SUBNET (default 10.88.0). Everything it starts is killed, and its
# namespaces and folders removed, on exit.
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="$REPO/bench/ray/.venv"
PRISM="${PRISM:-${CARGO_TARGET_DIR:-$REPO/target}/release/prism}"
ROUNDS="${ROUNDS:-2}"
NET="${SUBNET:-10.88.0}"
TAG=upcmp
SW="$TAG-sw"
DIR="/var/tmp/$TAG-$$"
HEAD="$NET.1"
KEY="$DIR/id_user"
SSHOPTS=(-F none -o BatchMode=yes -o ConnectTimeout=3 -o StrictHostKeyChecking=no
    -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR -i "$KEY")

die() { echo "up_compare: $*" >&2; exit 1; }

[[ $(id -u) -eq 0 ]] || die "needs root (network namespaces)"
for t in /usr/sbin/sshd ssh ssh-keygen rsync ip unshare nsenter curl timeout; do
    command -v "$t" >/dev/null || die "no $t"
done
[[ -x "$VENV/bin/ray" ]] || die "no $VENV/bin/ray: run bash bench/ray/setup.sh"
[[ -x "$PRISM" ]] || die "no $PRISM: build it with cargo build --release -p prism-cli --bin prism, or name one with PRISM="
if ip -br addr | grep -q " $NET\." || ip route | grep -q "^$NET\."; then
    die "$NET.0/24 is in use here; set SUBNET to a free /24 (e.g. SUBNET=10.87.0)"
fi
for n in "$SW" "$TAG-0" "$TAG-1" "$TAG-2" "$TAG-3"; do
    ip netns list | grep -qw "^$n" && die "namespace $n exists already (another run?)"
done

SSHD_PIDS=()
HOLDER=""
MADE_NS=()
cleanup() {
    set +e
    trap - EXIT INT TERM
    for n in "${MADE_NS[@]}"; do
        ip netns pids "$n" 2>/dev/null | xargs -r kill -9 2>/dev/null
    done
    for p in "${SSHD_PIDS[@]}" $HOLDER; do kill -9 "$p" 2>/dev/null; done
    # Bounded wait for the killed processes to go, so the namespaces can go.
    local deadline=$((SECONDS + 10))
    while ((SECONDS < deadline)); do
        local left=0
        for n in "${MADE_NS[@]}"; do
            [[ -n "$(ip netns pids "$n" 2>/dev/null)" ]] && left=1
        done
        ((left == 0)) && break
        sleep 0.2
    done
    for n in "${MADE_NS[@]}"; do ip netns del "$n" 2>/dev/null; done
    rm -rf "$DIR"
    echo "up_compare: cleaned up (namespaces: $(ip netns list | grep -c "^$TAG-") left)"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

mkdir -p "$DIR/home" "$DIR/bin"

# --- The network: a bridge in its own namespace, a veth per host. ---
ip netns add "$SW" && MADE_NS+=("$SW") || die "ip netns add $SW"
ip -n "$SW" link set lo up
ip -n "$SW" link add br0 type bridge
ip -n "$SW" link set br0 up
for i in 0 1 2 3; do
    ns="$TAG-$i"
    ip netns add "$ns" && MADE_NS+=("$ns") || die "ip netns add $ns"
    ip link add "v$i" netns "$SW" type veth peer name eth0 netns "$ns" || die "veth $i"
    ip -n "$SW" link set "v$i" master br0
    ip -n "$SW" link set "v$i" up
    ip -n "$ns" addr add "$NET.$((i + 1))/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
done

# --- Keys and sshd on hosts 0-2, as the test harness runs them. ---
ssh-keygen -q -t ed25519 -N "" -f "$KEY" || die "ssh-keygen"
cp "$KEY.pub" "$DIR/authorized_keys"
# The venv's Python may live under /root (pyenv here), which each host
# replaces with its own: such a host sees that Python's install (its prefix,
# read-only) at the same path, as a machine with Python installed would.
PYPREFIX="$(dirname "$(dirname "$(readlink -f "$VENV/bin/python3")")")"
case "$PYPREFIX" in
/tmp | /tmp/*) die "the venv's Python is under /tmp ($PYPREFIX), which each host replaces" ;;
/root/*)
    PYMOUNT="mkdir -p $DIR/py_\$\$ && mount --bind $PYPREFIX $DIR/py_\$\$ && mount -t tmpfs tmpfs /tmp && mount -t tmpfs tmpfs /root && mkdir -p $PYPREFIX && mount --bind -o ro $DIR/py_\$\$ $PYPREFIX && umount -l $DIR/py_\$\$"
    ;;
*) PYMOUNT="mount -t tmpfs tmpfs /tmp && mount -t tmpfs tmpfs /root" ;;
esac
# Each host's ~/.bashrc puts the venv on PATH, as a machine with Ray
# installed has it: `ray down` runs a plain `ray stop` on the head (Ray runs
# its commands through `bash --login -c -i 'source ~/.bashrc; ...'`).
for i in 0 1 2; do
    ssh-keygen -q -t ed25519 -N "" -f "$DIR/host_$i" || die "ssh-keygen"
    cat >"$DIR/sshd_$i.conf" <<EOF
ListenAddress $NET.$((i + 1))
Port 22
HostKey $DIR/host_$i
PidFile $DIR/sshd_$i.pid
AuthorizedKeysFile $DIR/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
EOF
    # A PID namespace of its own too (unlike the test harness): `ray stop`
    # kills Ray's processes by name, so a worker's `ray stop` would otherwise
    # kill the head's raylet and dashboard on this one machine.
    ip netns exec "$TAG-$i" unshare --mount --uts --pid --fork --kill-child --mount-proc sh -c \
        "$PYMOUNT && echo 'export PATH=$VENV/bin:\$PATH' >/root/.bashrc && hostname machine$i && exec /usr/sbin/sshd -D -e -f $DIR/sshd_$i.conf" \
        </dev/null >"$DIR/sshd_$i.log" 2>&1 &
    SSHD_PIDS+=($!)
    disown $!
done

# --- The laptop (host 3): a mount namespace with its own /tmp, held open by
# a sleep, in which every launcher command runs (nsenter). The prism binary
# keeps its path there through a bind mount.
ip netns exec "$TAG-3" unshare --mount sh -c \
    "mount --bind $(dirname "$PRISM") $DIR/bin && mount -t tmpfs tmpfs /tmp && mkdir -p $(dirname "$PRISM") && mount --bind $DIR/bin $(dirname "$PRISM") && exec sleep 86400" \
    </dev/null >"$DIR/laptop.log" 2>&1 &
HOLDER=$!
disown $!
deadline=$((SECONDS + 15))
until [[ "$(cat /proc/$HOLDER/comm 2>/dev/null)" == sleep ]] &&
    nsenter -t "$HOLDER" -m test -x "$PRISM"; do
    ((SECONDS < deadline)) || die "the laptop's namespace did not come up: $(cat "$DIR/laptop.log")"
    sleep 0.1
done
# Ray's autoscaler v1: with v2 (Ray's default since 2.50) and the local
# provider, Ray 2.60.0 took the head (its node type is the workers' one) for
# a worker, then found "cloud instance 10.88.0.1 no longer found", launched
# one worker only and logged "Adding 1 node(s)" every 5 s without launching
# the second (tried 2026-11-28). RAY_AUTOSCALER_V2=1 runs v2.
laptop() {
    nsenter -t "$HOLDER" -m -n env HOME="$DIR/home" RAY_USAGE_STATS_ENABLED=0 \
        RAY_UP_enable_autoscaler_v2="${RAY_AUTOSCALER_V2:-0}" \
        PATH="$VENV/bin:$PATH" "$@"
}

for i in 0 1 2; do
    deadline=$((SECONDS + 20))
    until laptop timeout 10 ssh "${SSHOPTS[@]}" "root@$NET.$((i + 1))" true 2>/dev/null; do
        ((SECONDS < deadline)) || die "sshd on $NET.$((i + 1)) does not answer: $(cat "$DIR/sshd_$i.log")"
        sleep 0.2
    done
done
echo "up_compare: hosts $NET.1-3 answer over SSH; laptop $NET.4"

# --- The cluster files. ---
cat >"$DIR/prism.yaml" <<EOF
cluster_name: $TAG
provider:
  type: ssh
  head_ip: $NET.1
  worker_ips: [$NET.2, $NET.3]
auth:
  ssh_user: root
  ssh_private_key: $KEY
available_node_types:
  head:
    resources: {CPU: 1}
  worker:
    resources: {CPU: 1}
    min_workers: 2
    max_workers: 2
head_node_type: head
EOF

# --node-ip-address: the hosts have no default route, so Ray's own guess
# (a UDP socket towards 8.8.8.8) fails on the head; Prism's default start
# commands pass the address from the file the same way.
cat >"$DIR/ray.yaml" <<EOF
cluster_name: $TAG
provider:
  type: local
  head_ip: $NET.1
  worker_ips: [$NET.2, $NET.3]
auth:
  ssh_user: root
  ssh_private_key: $KEY
min_workers: 2
max_workers: 2
upscaling_speed: 1.0
idle_timeout_minutes: 5
file_mounts: {}
initialization_commands: []
setup_commands: []
head_setup_commands: []
worker_setup_commands: []
head_start_ray_commands:
  - $VENV/bin/ray stop
  - $VENV/bin/ray start --head --port=6379 --autoscaling-config=~/ray_bootstrap_config.yaml --dashboard-host=0.0.0.0 --node-ip-address=\$(hostname -I | cut -d' ' -f1) --disable-usage-stats
worker_start_ray_commands:
  - $VENV/bin/ray stop
  - $VENV/bin/ray start --address=\$RAY_HEAD_IP:6379 --node-ip-address=\$(hostname -I | cut -d' ' -f1) --disable-usage-stats
EOF

# --- Timing. ---
declare -A R
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }
# timed KEY LIMIT CMD...: runs CMD on the laptop, bounded, its output
# indented; R[KEY] becomes its seconds, or FAIL(rc) after them.
timed() {
    local key=$1 limit=$2; shift 2
    echo "--- $key: $*"
    local t0 rc
    t0=$(now)
    laptop timeout -k 5 "$limit" "$@" 2>&1 | sed 's/^/    /'
    rc=${PIPESTATUS[0]}
    local t
    t=$(since "$t0")
    if ((rc == 0)); then R[$key]=$t; else R[$key]="FAIL(rc=$rc,${t}s)"; fi
    echo "--- $key: ${R[$key]} s"
}

# The number of nodes Ray's GCS lists ALIVE, through the dashboard's state
# API on the head (0 while it does not answer).
ray_alive() {
    laptop curl -s -m 2 "http://$HEAD:8265/api/v0/nodes?limit=100" 2>/dev/null |
        grep -o '"state": *"ALIVE"' | wc -l
}
# wait_alive KEY T0: polls every 1 s, up to 180 s, until 3 nodes are alive;
# R[KEY] becomes the seconds since T0.
wait_alive() {
    local key=$1 t0=$2 n=0 deadline=$((SECONDS + 180))
    while ((SECONDS < deadline)); do
        n=$(ray_alive)
        ((n >= 3)) && break
        sleep 1
    done
    if ((n >= 3)); then R[$key]=$(since "$t0"); else R[$key]="FAIL(${n}alive,$(since "$t0")s)"; fi
    echo "--- $key: ${R[$key]} s ($n alive)"
}

# Lists, then kills, what is left on hosts 0-2 but sshd's listener (and the
# unshare that holds its namespaces).
leftovers() {
    local what=$1 i p c out=""
    for i in 0 1 2; do
        local names=""
        for p in $(ip netns pids "$TAG-$i"); do
            # unshare and its child, the sshd listener
            [[ $p == "${SSHD_PIDS[$i]}" ]] && continue
            [[ $(awk '{print $4}' /proc/$p/stat 2>/dev/null) == "${SSHD_PIDS[$i]}" ]] && continue
            c=$(cat /proc/$p/comm 2>/dev/null)
            kill -9 "$p" 2>/dev/null
            # sshd's sessions (ssh's ControlPersist masters) are not counted
            [[ $c == sshd ]] || names+="$c"$'\n'
        done
        [[ -n $names ]] && out+=" machine$i: $(printf '%s' "$names" | sort | uniq -c |
            awk '{printf "%s%s", (NR > 1 ? ", " : ""), ($1 > 1 ? $1 "x " : "") $2}');"
    done
    R[$what]=${out:- none}
    echo "--- left on the hosts after $what:${out:- none}"
}

run_prism() {
    local r=$1
    timed "p_up.$r" 180 "$PRISM" up "$DIR/prism.yaml"
    echo "--- prism status on the head:"
    laptop timeout -k 5 60 "$PRISM" exec "$DIR/prism.yaml" -- prism status 2>&1 | sed 's/^/    /'
    timed "p_up2.$r" 180 "$PRISM" up "$DIR/prism.yaml"
    timed "p_down.$r" 120 "$PRISM" down "$DIR/prism.yaml"
    leftovers "p_left.$r"
}

run_ray() {
    local r=$1 t0
    t0=$(now)
    timed "r_up.$r" 300 ray up -y "$DIR/ray.yaml"
    if [[ ${R[r_up.$r]} == FAIL* ]]; then
        laptop timeout -k 5 180 ray down -y "$DIR/ray.yaml" >/dev/null 2>&1
        leftovers "r_left.$r"
        return
    fi
    wait_alive "r_alive.$r" "$t0"
    echo "--- ray status on the head:"
    laptop timeout -k 5 60 ssh "${SSHOPTS[@]}" "root@$HEAD" \
        "$VENV/bin/python -c \"import ray; ray.init(address='auto', logging_level='ERROR'); print('alive nodes:', sum(n['Alive'] for n in ray.nodes()))\"" 2>&1 |
        grep -v '^$' | tail -3 | sed 's/^/    /'
    t0=$(now)
    timed "r_up2.$r" 300 ray up -y "$DIR/ray.yaml"
    wait_alive "r_alive2.$r" "$t0"
    timed "r_upnr.$r" 300 ray up -y --no-restart "$DIR/ray.yaml"
    timed "r_down.$r" 180 ray down -y "$DIR/ray.yaml"
    leftovers "r_left.$r"
}

for r in $(seq 1 "$ROUNDS"); do
    echo "=== round $r, prism ($(uptime))"
    run_prism "$r"
    echo "=== round $r, ray ($(uptime))"
    run_ray "$r"
    echo "=== round $r done ($(uptime))"
done

# --- The table. ---
row() {
    local label=$1 key=$2 r line
    line=$(printf '%-44s' "$label")
    for r in $(seq 1 "$ROUNDS"); do line+=$(printf ' | %-22s' "${R[$key.$r]:-}"); done
    echo "$line"
}
echo
head=$(printf '%-44s' "seconds (wall clock)")
for r in $(seq 1 "$ROUNDS"); do head+=$(printf ' | %-22s' "round $r"); done
echo "$head"
row "prism up (3 nodes joined)" p_up
row "second prism up (nothing to change)" p_up2
row "prism down" p_down
row "ray up (returns)" r_up
row "ray up until 3 nodes alive" r_alive
row "second ray up (restarts Ray)" r_up2
row "second ray up until 3 nodes alive again" r_alive2
row "ray up --no-restart" r_upnr
row "ray down" r_down
echo
for r in $(seq 1 "$ROUNDS"); do
    echo "round $r: left on hosts after prism down:${R[p_left.$r]}"
    echo "round $r: left on hosts after ray down:${R[r_left.$r]}"
done
echo "load: $(uptime)"
