"""Joins Prism's CUDA all-reduce rows (cuda_collective) and gloo's rows on
CUDA tensors (gloo_allreduce.py --device cuda) from one log into a markdown
table: time and bus bandwidth of each, and Prism's speed-up.

    python3 table.py run.log
"""

import sys


def human(n):
    for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} B"


def main(path):
    rows = {}
    for line in open(path):
        f = line.split()
        if len(f) != 7 or f[0] not in ("prism-cuda", "gloo-cuda"):
            continue
        if f[0] == "prism-cuda" and f[1] != "ipc":
            continue  # the host-staged rows (section 1b) are not in this table
        try:
            key = (int(f[2]), int(f[3]))
            rows.setdefault(key, {})[f[0]] = (float(f[4]), float(f[6]))
        except ValueError:
            continue
    print("| world | bytes | Prism time | Prism busbw | gloo time | gloo busbw | Prism vs gloo |")
    print("|---|---|---|---|---|---|---|")
    for (world, nbytes) in sorted(rows):
        r = rows[(world, nbytes)]
        p, g = r.get("prism-cuda"), r.get("gloo-cuda")
        cells = [str(world), human(nbytes)]
        for v in (p, g):
            cells += [f"{v[0]:,.1f} us", f"{v[1]:.2f} GB/s"] if v else ["-", "-"]
        cells.append(f"{g[0] / p[0]:.1f}x" if p and g else "-")
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "/dev/stdin")
