#!/usr/bin/env bash
# Build a small container image of `prism` with buildah, FROM scratch:
#
#   /usr/local/bin/prism             the release binary, stripped
#   /usr/local/bin/prism-entrypoint  starts a head or a worker node (see below)
#   the shared libraries prism links (found with ldd here, same paths)
#   /bin/busybox + applet links      /bin/sh and tools for job entrypoints,
#                                    probes and `prism up`'s podman provider
#   /etc/passwd, /etc/group          user `prism` (1000:1000), home /home/prism
#   /tmp (1777), /home/prism         writable; the image runs as USER 1000
#
# Usage: bash deploy/image/build.sh [--prism PATH] [--tag NAME] [--busybox PATH]
#
#   --prism PATH    the prism binary (default: $PRISM_BINARY, else
#                   ${CARGO_TARGET_DIR:-<repo>/target}/release/prism)
#   --tag NAME      the image name (default: localhost/prism:dev)
#   --busybox PATH  a statically linked busybox (default: /bin/busybox)
#
# Needs buildah, ldd, strip and a static busybox (Debian: apt-get install -y
# buildah binutils busybox-static). Run it as root, or inside
# `buildah unshare` as another user. Running it again replaces the tag.
#
# The entrypoint, configured by environment (extra arguments go to
# `prism start` as they are):
#   PRISM_ROLE=head|worker     or the first argument `head` / `worker`
#   PRISM_HEAD_ADDRESS         HOST[:PORT] of the head (workers; port 6380)
#   PRISM_AUTH_TOKEN           the cluster token, or
#   PRISM_AUTH_TOKEN_FILE      a file holding it (default: /var/run/secrets/prism/token
#                              when that exists), passed as --token-file
#   PRISM_PORT                 the head's port (default 6380)
#   PRISM_NODE_IP              --node-ip-address (default: prism finds it)
#   PRISM_STATE_DIR            --state-dir (head; a volume that outlives the pod)
#   PRISM_DASHBOARD_HOST       (head; default 0.0.0.0), PRISM_DASHBOARD_PORT
#   PRISM_METRICS_EXPORT_PORT  a fixed metrics port (default: prism picks one)
# prism reads its own settings from the environment too: PRISM_NUM_CPUS,
# PRISM_NUM_GPUS, PRISM_MEMORY_BYTES, PRISM_OBJECT_STORE_MEMORY_BYTES, ...
set -euo pipefail

case "${BASH_SOURCE[0]}" in
    */*) here="${BASH_SOURCE[0]%/*}" ;;
    *) here=. ;;
esac
repo=$(cd "$here/../.." && pwd)
prism_bin="${PRISM_BINARY:-${CARGO_TARGET_DIR:-$repo/target}/release/prism}"
tag="localhost/prism:dev"
busybox_bin="/bin/busybox"

die() { echo "build.sh: $*" >&2; exit 1; }

while [ $# -gt 0 ]; do
    case "$1" in
        --prism) [ $# -ge 2 ] || die "--prism needs a path"; prism_bin="$2"; shift 2 ;;
        --prism=*) prism_bin="${1#*=}"; shift ;;
        --tag) [ $# -ge 2 ] || die "--tag needs a name"; tag="$2"; shift 2 ;;
        --tag=*) tag="${1#*=}"; shift ;;
        --busybox) [ $# -ge 2 ] || die "--busybox needs a path"; busybox_bin="$2"; shift 2 ;;
        --busybox=*) busybox_bin="${1#*=}"; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown argument: $1 (see --help)" ;;
    esac
done

# --- the tools ---------------------------------------------------------------
missing=()
for tool in buildah ldd strip; do
    command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
if [ ${#missing[@]} -gt 0 ]; then
    die "missing tools: ${missing[*]} (Debian/Ubuntu: apt-get install -y buildah libc-bin binutils)"
fi
[ -x "$busybox_bin" ] || die "no busybox at $busybox_bin (Debian/Ubuntu: apt-get install -y busybox-static, or give --busybox PATH)"
if ldd "$busybox_bin" >/dev/null 2>&1; then
    die "$busybox_bin is dynamically linked; use a static one (apt-get install -y busybox-static)"
fi
[ -f "$prism_bin" ] || die "no prism binary at $prism_bin (cargo build --release -p prism-cli, or give --prism PATH)"
[ -x "$prism_bin" ] || die "$prism_bin is not executable"

# --- the root file system, staged in a scratch folder --------------------------
work=$(mktemp -d "${TMPDIR:-/tmp}/prism-image.XXXXXX")
ctr=""
cleanup() {
    [ -n "$ctr" ] && buildah rm "$ctr" >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT
root="$work/root"
mkdir -p "$root"/{bin,etc,tmp,home/prism,usr/local/bin}

# prism, stripped (the original is left alone).
cp "$prism_bin" "$root/usr/local/bin/prism"
strip --strip-all "$root/usr/local/bin/prism"
chmod 0755 "$root/usr/local/bin/prism"

# The shared libraries prism links, at the paths ldd names (the dynamic loader
# included, e.g. /lib64/ld-linux-x86-64.so.2); symlinks are followed, so each
# path holds the real file.
ldd_out=$(ldd "$prism_bin" 2>&1) || true
if printf '%s\n' "$ldd_out" | grep -q 'not found'; then
    die "$prism_bin needs libraries this machine lacks: $(printf '%s\n' "$ldd_out" | grep 'not found' | tr -s ' \t' ' ' | tr '\n' ';')"
fi
libs=$(printf '%s\n' "$ldd_out" | awk '
    $2 == "=>" && $3 ~ /^\// { print $3; next }
    $1 ~ /^\// { print $1 }')
if [ -z "$libs" ] && ! printf '%s\n' "$ldd_out" | grep -Eq 'not a dynamic executable|statically linked'; then
    die "ldd found no libraries for $prism_bin: $ldd_out"
fi
for lib in $libs; do
    [ -e "$lib" ] || die "ldd names $lib, which does not exist"
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
done
# glibc reads this for host names; without it, it guesses (dns before files).
printf 'passwd: files\ngroup: files\nhosts: files dns\n' >"$root/etc/nsswitch.conf"

# busybox as /bin/sh, and the applets job entrypoints, probes and the
# cluster launcher's podman provider (`prism up`) use.
cp "$busybox_bin" "$root/bin/busybox"
chmod 0755 "$root/bin/busybox"
applets=$("$busybox_bin" --list)
for applet in sh wget cat ls sleep kill ps env id hostname nslookup grep head tail \
    mkdir ln rm mv cp chmod tar dirname basename setsid sed tr date touch wc uname \
    printf echo test true false sort cut find xargs mktemp du df; do
    if printf '%s\n' "$applets" | grep -qx "$applet"; then
        ln -sf busybox "$root/bin/$applet"
    fi
done

# The user.
cat >"$root/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/bin/sh
prism:x:1000:1000:prism:/home/prism:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
EOF
cat >"$root/etc/group" <<'EOF'
root:x:0:
prism:x:1000:
nogroup:x:65534:
EOF

# The entrypoint.
cat >"$root/usr/local/bin/prism-entrypoint" <<'EOF'
#!/bin/sh
# Start a Prism node in the foreground: a head (PRISM_ROLE=head, or the first
# argument `head`) or a worker joining PRISM_HEAD_ADDRESS. Other arguments go
# to `prism start`. The token comes from PRISM_AUTH_TOKEN (read by prism from
# its environment) or PRISM_AUTH_TOKEN_FILE, never from the command line.
set -eu

role="${PRISM_ROLE:-worker}"
case "${1:-}" in
    head|worker) role="$1"; shift ;;
esac

set -- start --block "$@"

token_file="${PRISM_AUTH_TOKEN_FILE:-}"
if [ -z "$token_file" ] && [ -f /var/run/secrets/prism/token ]; then
    token_file=/var/run/secrets/prism/token
fi
if [ -n "$token_file" ]; then
    [ -r "$token_file" ] || { echo "prism-entrypoint: cannot read the token file $token_file" >&2; exit 1; }
    set -- "$@" --token-file "$token_file"
fi

# (PRISM_NUM_CPUS, PRISM_MEMORY_BYTES, PRISM_OBJECT_STORE_MEMORY_BYTES and the
# other settings prism reads from its environment need no flag.)
[ -n "${PRISM_NODE_IP:-}" ] && set -- "$@" --node-ip-address "$PRISM_NODE_IP"
[ -n "${PRISM_METRICS_EXPORT_PORT:-}" ] && set -- "$@" --metrics-export-port "$PRISM_METRICS_EXPORT_PORT"

case "$role" in
    head)
        set -- "$@" --head --port "${PRISM_PORT:-6380}" \
            --dashboard-host "${PRISM_DASHBOARD_HOST:-0.0.0.0}"
        [ -n "${PRISM_DASHBOARD_PORT:-}" ] && set -- "$@" --dashboard-port "$PRISM_DASHBOARD_PORT"
        [ -n "${PRISM_STATE_DIR:-}" ] && set -- "$@" --state-dir "$PRISM_STATE_DIR"
        ;;
    worker)
        address="${PRISM_HEAD_ADDRESS:-}"
        [ -n "$address" ] || { echo "prism-entrypoint: a worker needs PRISM_HEAD_ADDRESS (HOST[:PORT] of the head), or PRISM_ROLE=head" >&2; exit 1; }
        case "$address" in
            *:*) ;;
            *) address="$address:${PRISM_PORT:-6380}" ;;
        esac
        if [ -z "$token_file" ] && [ -z "${PRISM_AUTH_TOKEN:-}" ]; then
            echo "prism-entrypoint: a worker needs the cluster token: PRISM_AUTH_TOKEN or PRISM_AUTH_TOKEN_FILE" >&2
            exit 1
        fi
        set -- "$@" --address "$address"
        ;;
    *)
        echo "prism-entrypoint: PRISM_ROLE must be head or worker, not '$role'" >&2
        exit 1
        ;;
esac

exec /usr/local/bin/prism "$@"
EOF
chmod 0755 "$root/usr/local/bin/prism-entrypoint"

# Ownership and modes: root owns the system, the user its home.
chown -R 0:0 "$root"
chmod 0755 "$root" "$root/bin" "$root/etc" "$root/home" "$root/usr" "$root/usr/local" "$root/usr/local/bin"
chmod 0644 "$root/etc/passwd" "$root/etc/group" "$root/etc/nsswitch.conf"
chmod 1777 "$root/tmp"
chown 1000:1000 "$root/home/prism"
chmod 0755 "$root/home/prism"

# --- the image -------------------------------------------------------------------
ctr=$(buildah from scratch)
# Copied through a mount, not `buildah copy` (which would make every file
# root's): owners and modes stay as staged. As another user than root, run this
# script inside `buildah unshare`.
mnt=$(buildah mount "$ctr")
cp -a "$root/." "$mnt/"
buildah umount "$ctr" >/dev/null
buildah config \
    --user 1000:1000 \
    --workingdir /home/prism \
    --env PATH=/usr/local/bin:/bin \
    --env HOME=/home/prism \
    --env PRISM_TEMP_DIR=/tmp/prism \
    --entrypoint '["/usr/local/bin/prism-entrypoint"]' \
    --cmd '[]' \
    --port 6380 --port 8265 \
    --label org.opencontainers.image.title=prism \
    --label org.opencontainers.image.description="Prism distributed runtime node" \
    "$ctr"
old_id=$(buildah images --quiet --no-trunc "$tag" 2>/dev/null | head -n1 || true)
new_id=$(buildah commit --quiet --rm "$ctr" "$tag")
ctr=""
# The image this tag named before, now untagged, goes (unless a container uses it).
if [ -n "$old_id" ] && [ "${old_id#sha256:}" != "${new_id#sha256:}" ]; then
    buildah rmi "$old_id" >/dev/null 2>&1 || true
fi

size=$(buildah images --format '{{.Size}}' "$tag" | head -n1)
echo "built $tag ($size)"
buildah images "$tag"
