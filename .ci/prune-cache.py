"""Keeps a build cache that lives across CI runs from filling the disk.

    python3 .ci/prune-cache.py TARGET_DIR

Cargo writes each build of a test or example binary under a new hashed
name (`<name>-<hash>` in `<profile>/deps`) and never removes the old
ones: a cache kept across a day of builds of this workspace held 35 GB of
them. This keeps the newest binary of each name and removes the rest;
cargo builds again any binary it needs that is gone. Libraries
(`.rlib`, `.rmeta`, `.so`) and everything else are left alone. Prints
what it freed."""

import collections
import os
import sys


def prune(target):
    freed = 0
    for profile in ("debug", "release"):
        deps = os.path.join(target, profile, "deps")
        if not os.path.isdir(deps):
            continue
        by_name = collections.defaultdict(list)
        for entry in os.scandir(deps):
            name, dash, build = entry.name.rpartition("-")
            # An executable: no extension, a hash after its last dash.
            if not dash or "." in entry.name or not entry.is_file(follow_symlinks=False):
                continue
            if not os.access(entry.path, os.X_OK):
                continue
            by_name[name].append((entry.stat().st_mtime, entry.path))
        for builds in by_name.values():
            builds.sort()
            for _, path in builds[:-1]:
                try:
                    freed += os.path.getsize(path)
                    os.remove(path)
                except OSError as e:
                    print(f"could not remove {path}: {e}", file=sys.stderr)
    return freed


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    print(f"freed {prune(sys.argv[1]) / 1e9:.1f} GB of older test and example builds")
