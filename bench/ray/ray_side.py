#!/usr/bin/env python3
"""Ray's side of the Prism/Ray comparison.

Runs Ray's own `ray microbenchmark` and then extra_rows.py (the rows Ray's
benchmark lacks), both with the Python of bench/ray/.venv (bench/ray/setup.sh
makes it), and prints one `name value unit` line per figure on stdout, with
the row names of Prism's examples/microbenchmark.rs. Each line is printed as
soon as Ray prints its figure, so the rows already measured survive a crash
or a timeout of a later section.

TESTS_TO_RUN / TESTS_TO_SKIP (Ray's own: one substring of Ray's test names)
pick a subset of `ray microbenchmark`. --quick sets TESTS_TO_RUN to one task
row when it is unset, and gives extra_rows.py fewer rounds.

Ray's benchmark ends with a Ray Client section (and earlier versions crashed
there on this machine) whose rows have no Prism counterpart: once every row
that the filter selects has been printed, the benchmark is stopped rather than
left to run that section (--with-client keeps it).

Every process a run leaves behind is ended by its pid: this script is the
child subreaper of what it starts, so Ray's daemons stay in its process tree.
Raw output goes to --raw (default: stderr). Exit status 1 when a selected row
is missing or a part failed; the rows measured are printed all the same.
"""

import argparse
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time

from proctree import become_subreaper, end_below  # this folder is on sys.path

HERE = os.path.dirname(os.path.abspath(__file__))
VENV_PYTHON = os.path.join(HERE, ".venv", "bin", "python")
QUICK_TESTS = "single client tasks sync"

# Ray's test name -> (row, unit, factor), in the order ray_perf.py runs them.
# The gigabyte rows keep Ray's unit: Ray counts 0.8 "gigabytes" per put of
# 100 * 2^20 int64 (838,860,800 bytes), i.e. 1 GB = 1000 * 2^20 bytes, and
# Prism's rows of the same name use Ray's multipliers.
ROWS = {
    "single client get calls (Plasma Store)": ("single_client_get_calls", "per_s", 1),
    "single client put calls (Plasma Store)": ("single_client_put_calls", "per_s", 1),
    "multi client put calls (Plasma Store)": ("multi_client_put_calls", "per_s", 1),
    "single client put gigabytes": ("single_client_put_gigabytes", "GB_per_s", 1),
    "single client tasks and get batch": ("single_client_tasks_and_get_batch", "per_s", 1),
    "multi client put gigabytes": ("multi_client_put_gigabytes", "GB_per_s", 1),
    "single client get object containing 10k refs": (
        "single_client_get_object_containing_10k_refs", "per_s", 1),
    "single client wait 1k refs": ("single_client_wait_1k_refs", "per_s", 1),
    "single client tasks sync": ("single_client_tasks_sync", "per_s", 1),
    "single client tasks async": ("single_client_tasks_async", "per_s", 1),
    "multi client tasks async": ("multi_client_tasks_async", "per_s", 1),
    "1:1 actor calls sync": ("1_1_actor_calls_sync", "per_s", 1),
    "1:1 actor calls async": ("1_1_actor_calls_async", "per_s", 1),
    "1:1 actor calls concurrent": ("1_1_actor_calls_concurrent", "per_s", 1),
    "1:n actor calls async": ("1_n_actor_calls_async", "per_s", 1),
    "n:n actor calls async": ("n_n_actor_calls_async", "per_s", 1),
    "n:n actor calls with arg async": ("n_n_actor_calls_with_arg_async", "per_s", 1),
    "1:1 async-actor calls sync": ("1_1_async_actor_calls_sync", "per_s", 1),
    "1:1 async-actor calls async": ("1_1_async_actor_calls_async", "per_s", 1),
    "1:1 async-actor calls with args async": (
        "1_1_async_actor_calls_with_args_async", "per_s", 1),
    "1:n async-actor calls async": ("1_n_async_actor_calls_async", "per_s", 1),
    "n:n async-actor calls async": ("n_n_async_actor_calls_async", "per_s", 1),
    "placement group create/removal": ("placement_group_create_removal", "per_s", 1),
}

LINE = re.compile(r"^(?P<name>.+?) per second (?P<mean>[-+0-9.eE]+) \+- (?P<sd>[-+0-9.eEnaN]+)\s*$")


def normalise(ray_name):
    """(row, unit, factor) for a test name, known or not (Ray Client rows)."""
    if ray_name in ROWS:
        return ROWS[ray_name]
    row = ray_name.lower().replace("(plasma store)", "").replace("client:", "client")
    row = re.sub(r"[^a-z0-9]+", "_", row).strip("_")
    if "gigabytes" in row:
        return row, "GB_per_s", 1
    return row, "per_s", 1


def selected(ray_name, run, skip):
    """Ray's own filter (ray_microbenchmark_helpers.timeit)."""
    return (not run or run in ray_name) and not (skip and skip in ray_name)


def emit(row, value, unit):
    print(f"{row} {value:.3f} {unit}", flush=True)


# --- processes -------------------------------------------------------------

def end_leftovers(log, grace_s=10.0):
    """SIGTERM, then SIGKILL, every process still below us, by pid."""
    end_below(os.getpid(), grace_s=grace_s, log=log)


def stop(proc, grace_s=15.0):
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=grace_s)


def stream(cmd, env, log, total_s, stall_s, on_line):
    """Runs cmd, hands each output line to on_line (which returns True to stop
    the run early). Returns (exit code or None, why it ended)."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, text=True, errors="replace",
                            bufsize=1, start_new_session=True)
    lines = queue.Queue()

    def pump():
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + total_s
    why = "exited"
    try:
        while True:
            wait = min(stall_s, deadline - time.monotonic())
            if wait <= 0:
                why = f"ran past {total_s:.0f} s"
                break
            try:
                line = lines.get(timeout=wait)
            except queue.Empty:
                why = (f"ran past {total_s:.0f} s" if time.monotonic() >= deadline
                       else f"printed nothing for {stall_s:.0f} s")
                break
            if line is None:
                break
            log(line.rstrip("\n"))
            if on_line(line.rstrip("\n")):
                why = "stopped: every selected row printed"
                break
    finally:
        stop(proc)
        end_leftovers(log)
    return proc.returncode, why


# --- main --------------------------------------------------------------------

def main():
    parser = argparse.ArgumentParser(
        description="Ray's side of the Prism/Ray comparison: `name value unit` lines.")
    parser.add_argument("--quick", action="store_true",
                        help=f"TESTS_TO_RUN='{QUICK_TESTS}' when unset; fewer extra rounds")
    parser.add_argument("--python", default=VENV_PYTHON, help="the venv's python")
    parser.add_argument("--raw", help="file for Ray's raw output (default: stderr)")
    parser.add_argument("--no-microbenchmark", action="store_true", help="extra rows only")
    parser.add_argument("--no-extra", action="store_true", help="`ray microbenchmark` only")
    parser.add_argument("--with-client", action="store_true",
                        help="let Ray's benchmark run its Ray Client section too")
    parser.add_argument("--timeout", type=float, default=1800,
                        help="seconds for `ray microbenchmark` (default 1800)")
    parser.add_argument("--stall-timeout", type=float, default=300,
                        help="seconds without output before giving up (default 300)")
    parser.add_argument("--extra-timeout", type=float, default=600,
                        help="seconds for extra_rows.py (default 600)")
    args = parser.parse_args()

    if not os.access(args.python, os.X_OK):
        sys.exit(f"{args.python} not found: run bench/ray/setup.sh first")

    raw = open(args.raw, "a", buffering=1) if args.raw else sys.stderr

    def log(text):
        raw.write(text + "\n")
        raw.flush()

    def on_signal(signum, _frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    become_subreaper()

    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)  # always a fresh local cluster
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no reporting out of this machine
    env.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # node address 127.0.0.1
    if args.quick and "TESTS_TO_RUN" not in env:
        env["TESTS_TO_RUN"] = QUICK_TESTS
    run, skip = env.get("TESTS_TO_RUN", ""), env.get("TESTS_TO_SKIP", "")

    failed = False
    try:
        if not args.no_microbenchmark:
            expected = {n for n in ROWS if selected(n, run, skip)}
            seen = set()

            def on_line(line):
                m = LINE.match(line.strip())
                if not m:
                    return False
                name = m.group("name")
                row, unit, factor = normalise(name)
                emit(row, float(m.group("mean")) * factor, unit)
                seen.add(name)
                return bool(expected) and expected <= seen and not args.with_client

            log(f"# ray microbenchmark (TESTS_TO_RUN={run!r} TESTS_TO_SKIP={skip!r})")
            started = time.monotonic()
            code, why = stream([args.python, "-u", "-m", "ray.scripts.scripts", "microbenchmark"],
                               env, log, args.timeout, args.stall_timeout, on_line)
            log(f"# ray microbenchmark: {why}, exit code {code}, "
                f"{time.monotonic() - started:.0f} s")
            missing = [n for n in ROWS if n in expected and n not in seen]
            if missing:
                failed = True
                print(f"ray_side: missing rows ({why}): {', '.join(missing)}", file=sys.stderr)
            elif why not in ("exited", "stopped: every selected row printed") or (
                    why == "exited" and code != 0):
                # Rows complete, but a later section (Ray Client) failed: keep them.
                print(f"ray_side: ray microbenchmark {why}, exit code {code}; "
                      "every selected row was printed", file=sys.stderr)

        if not args.no_extra:
            cmd = [args.python, "-u", os.path.join(HERE, "extra_rows.py")]
            if args.quick:
                cmd.append("--quick")
            log("# extra_rows.py")

            def on_extra(line):
                parts = line.split()
                if len(parts) == 3 and re.fullmatch(r"[a-z0-9_]+", parts[0]):
                    try:
                        emit(parts[0], float(parts[1]), parts[2])
                    except ValueError:
                        pass
                return False

            code, why = stream(cmd, env, log, args.extra_timeout, args.extra_timeout, on_extra)
            log(f"# extra_rows.py: {why}, exit code {code}")
            if code != 0:
                failed = True
                print(f"ray_side: extra_rows.py {why}, exit code {code}", file=sys.stderr)
    finally:
        end_leftovers(log)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
