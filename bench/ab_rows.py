"""Before/after of two builds of the microbenchmark, alternating.

    python3 bench/ab_rows.py OLD_BINARY NEW_BINARY [ROUNDS] [FILTER ...]

Runs each binary with PRISM_BENCH_ROWS=<filter> for every filter (default:
_calls_ and tasks), ROUNDS times (default 3), the order of the two swapped
every round so that a machine's drift falls on both, and prints each row's
median [min-max] per build and their ratio as a markdown table. Build the
binaries with `cargo build --release --example microbenchmark` at each
commit (a worktree per commit keeps both)."""

import os
import re
import statistics
import subprocess
import sys
import time


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    bins = {"before": sys.argv[1], "after": sys.argv[2]}
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    filters = sys.argv[4:] or ["_calls_", "tasks"]
    found = {}
    for r in range(rounds):
        order = ["before", "after"] if r % 2 == 0 else ["after", "before"]
        for side in order:
            for f in filters:
                env = dict(os.environ, PRISM_BENCH_ROWS=f)
                out = subprocess.run(
                    [bins[side]], env=env, capture_output=True, text=True, timeout=900
                ).stdout
                for line in out.splitlines():
                    m = re.match(r"^(\S+) ([0-9.]+) (\S+)$", line)
                    if m:
                        found.setdefault(m.group(1), {}).setdefault(side, []).append(
                            float(m.group(2))
                        )
        print(f"round {r + 1} of {rounds} done {time.strftime('%H:%M:%S')}", file=sys.stderr)

    def fmt(x):
        return f"{x:,.0f}" if x >= 100 else f"{x:.1f}"

    print("| row | before | after | after/before |")
    print("| --- | ---: | ---: | ---: |")
    for row, sides in found.items():
        if "before" not in sides or "after" not in sides:
            continue
        b, a = sides["before"], sides["after"]
        mb, ma = statistics.median(b), statistics.median(a)
        print(
            f"| {row} | {fmt(mb)} [{fmt(min(b))}-{fmt(max(b))}] "
            f"| {fmt(ma)} [{fmt(min(a))}-{fmt(max(a))}] | {ma / mb:.2f} |"
        )


if __name__ == "__main__":
    main()
