#!/usr/bin/env bash
# Build an application image on the Prism image: the Prism image with a
# program (a Prism driver, and any files beside it) in /app. A job's pod
# submits /app as the job's working_dir (deploy/kubernetes/job.yaml), or a
# node runs it where the program is installed at the same path.
#
# Usage: bash deploy/image/build-app.sh --program PATH [--file PATH ...]
#                                       [--base NAME] [--tag NAME]
#
#   --program PATH  the driver program, copied to /app/<its name>
#   --file PATH     another file for /app (may be given again)
#   --base NAME     the Prism image (default: localhost/prism:dev, built by
#                   deploy/image/build.sh)
#   --tag NAME      the image name (default: localhost/prism-app:dev)
#
# The program must link only what the Prism image holds (glibc, libgcc,
# libm): a Rust program built here does.
set -euo pipefail

base="localhost/prism:dev"
tag="localhost/prism-app:dev"
program=""
files=()
die() { echo "build-app.sh: $*" >&2; exit 1; }
while [ $# -gt 0 ]; do
    case "$1" in
        --program) [ $# -ge 2 ] || die "--program needs a path"; program="$2"; shift 2 ;;
        --file) [ $# -ge 2 ] || die "--file needs a path"; files+=("$2"); shift 2 ;;
        --base) [ $# -ge 2 ] || die "--base needs a name"; base="$2"; shift 2 ;;
        --tag) [ $# -ge 2 ] || die "--tag needs a name"; tag="$2"; shift 2 ;;
        -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown argument: $1 (see --help)" ;;
    esac
done
command -v buildah >/dev/null 2>&1 || die "buildah is missing (Debian/Ubuntu: apt-get install -y buildah)"
[ -n "$program" ] || die "give the program with --program PATH"
[ -f "$program" ] && [ -x "$program" ] || die "$program is not an executable file"
for f in "${files[@]}"; do
    [ -f "$f" ] || die "$f is not a file"
done
buildah images --quiet "$base" >/dev/null 2>&1 || die "no image $base (bash deploy/image/build.sh)"

ctr=""
cleanup() { [ -n "$ctr" ] && buildah rm "$ctr" >/dev/null 2>&1 || true; }
trap cleanup EXIT
ctr=$(buildah from --pull=never "$base")
mnt=$(buildah mount "$ctr")
mkdir -p "$mnt/app"
cp "$program" "$mnt/app/"
strip --strip-all "$mnt/app/$(basename "$program")" 2>/dev/null || true
for f in "${files[@]}"; do
    cp "$f" "$mnt/app/"
done
chown -R 1000:1000 "$mnt/app"
buildah umount "$ctr" >/dev/null
buildah config --workingdir /app "$ctr"
buildah commit --quiet --rm "$ctr" "$tag" >/dev/null
ctr=""
echo "built $tag ($(buildah images --format '{{.Size}}' "$tag" | head -n1)): /app/$(basename "$program")"
