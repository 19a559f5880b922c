"""Joins collective_bench and gloo_allreduce.py rows into one markdown table."""

import sys


def rows(path):
    out, comments = {}, []
    for line in open(path):
        if line.startswith("#"):
            comments.append(line.strip())
            continue
        f = line.split()
        if len(f) == 7:
            out[(int(f[2]), int(f[3]))] = (f[1], float(f[4]), float(f[6]))
    return out, comments


def human(n):
    for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n // size} {unit}"
    return f"{n} B"


prism, pc = rows(sys.argv[1])
gloo, gc = rows(sys.argv[2])
for c in pc + gc:
    print(c)
print()
print("| world | size | prism time (us) | prism busbw (GB/s) | gloo time (us) | gloo busbw (GB/s) | busbw ratio |")
print("|---|---|---|---|---|---|---|")
for key in sorted(prism):
    world, nbytes = key
    transport, pt, pb = prism[key]
    if key in gloo:
        _, gt, gb = gloo[key]
        print(f"| {world} | {human(nbytes)} | {pt:.1f} | {pb:.3f} | {gt:.1f} | {gb:.3f} | {pb / gb:.1f}x |")
    else:
        print(f"| {world} | {human(nbytes)} | {pt:.1f} | {pb:.3f} | - | - | - |")
