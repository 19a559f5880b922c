"""Joins collective_bench and gloo_allreduce.py rows (bench/collective/out/)
into one markdown table, keeping each implementation's fastest run per
(world, size)."""

import glob
import os
import sys


def best_rows(pattern):
    best, comments = {}, []
    for path in sorted(glob.glob(pattern)):
        for line in open(path):
            if line.startswith("#"):
                comments.append(line.strip())
                continue
            f = line.split()
            if len(f) < 7:
                continue
            key = (int(f[2]), int(f[3]))
            row = (f[1], float(f[4]), float(f[6]))
            if key not in best or row[1] < best[key][1]:
                best[key] = row
    return best, comments


def human(n):
    for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n // size} {unit}"
    return f"{n} B"


out = sys.argv[1]
prism, pc = best_rows(os.path.join(out, "prism.*.txt"))
gloo, gc = best_rows(os.path.join(out, "gloo.*.txt"))
for c in sorted(set(c for c in pc + gc if "memcpy" in c or "torch" in c or c.startswith("# op "))):
    print(c)
if os.path.exists(os.path.join(out, "load.txt")):
    print(open(os.path.join(out, "load.txt")).read().rstrip())
print()
print("| world | size | prism time (us) | prism busbw (GB/s) | gloo time (us) | gloo busbw (GB/s) | busbw ratio |")
print("|---|---|---|---|---|---|---|")
for key in sorted(prism):
    world, nbytes = key
    _, pt, pb = prism[key]
    if key in gloo:
        _, gt, gb = gloo[key]
        print(f"| {world} | {human(nbytes)} | {pt:.1f} | {pb:.3f} | {gt:.1f} | {gb:.3f} | {pb / gb:.1f}x |")
    else:
        print(f"| {world} | {human(nbytes)} | {pt:.1f} | {pb:.3f} | - | - | - |")
