"""Prints two benchmark runs' ROW lines side by side as a Markdown table.

    python3 bench/cluster/rows.py A.rows B.rows "A's name" "B's name" "ratio's name" [suffix]

Each line is `ROW <name> <value> <unit>`. The ratio is B's time over A's
(for a rate, A's rate over B's): how many times longer B took.
"""
import sys


def rows(path):
    out = {}
    for line in open(path):
        _, rest = line.split(" ", 1)
        name, value, unit = rest.rstrip("\n").rsplit(" ", 2)
        out[name] = (float(value), unit)
    return out


a_path, b_path, a_name, b_name, ratio_name = sys.argv[1:6]
suffix = sys.argv[6] if len(sys.argv) > 6 else ""
a, b = rows(a_path), rows(b_path)
print(f"| row | {a_name} | {b_name} | {ratio_name} |")
print("|---|---:|---:|---:|")
for name in list(a) + [n for n in b if n not in a]:
    x, y = a.get(name), b.get(name)
    cell = lambda v: f"{v[0]:,.3f} {v[1]}" if v else "-"
    ratio = "-"
    if x and y and x[0] > 0 and y[0] > 0:
        times = y[0] / x[0] if x[1] != "tasks/s" else x[0] / y[0]
        ratio = f"{times:.2f}x{suffix}"
    print(f"| {name} | {cell(x)} | {cell(y)} | {ratio} |")
