"""Ray's side of the rows that `ray microbenchmark` lacks.

Prints one `name value unit` line per figure, flushed as soon as it is known:

  cluster_start                  ms   ray.init() of a fresh local cluster
  first_task_latency             ms   first tiny task + ray.get, right after init
  actor_creation_plus_first_call ms   Actor.remote() + ray.get of its first call
  get_100mb_in_worker_ms         ms   a task taking the ObjectRef of a 100 MB float32
                                      array the driver put, returning its sum:
                                      submit + ray.get (after one warm-up call on the
                                      same ref; median of rounds)
  put_100mb_random_gigabytes     GB_per_s  ray.put of a 100 MB random float32 array:
                                      median of the puts after a first one
  cluster_shutdown               ms   ray.shutdown()
  idle_node_processes            processes  the driver and every process below it, in
                                      a second, fresh and idle cluster, once their
                                      number has been steady for 3 s
  idle_node_pss                  MiB  their total PSS (/proc/<pid>/smaps_rollup)
  single_client_streaming_values per_s  values of one num_returns="streaming" task
                                      yielding 1,000 b"ok", each ray.get as its ref
                                      arrives (timed as Ray's rows: warm-up, then the
                                      mean rate of trials; Prism's examples/microbenchmark.rs
                                      times its row the same way)

GB is 10^9 bytes; 100 MB is 10^8 bytes (25,000,000 float32).
Run with the venv's python: bench/ray/.venv/bin/python bench/ray/extra_rows.py [--quick]
"""

import argparse
import os
import statistics
import sys
import time

# Keep every Ray address on the loopback interface and send nothing out.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.pop("RAY_ADDRESS", None)

import numpy as np  # noqa: E402
import ray  # noqa: E402

from proctree import descendants, pss_kib  # noqa: E402  (this folder is on sys.path)

MB100_FLOATS = 25_000_000  # 10^8 bytes of float32


def report(name, value, unit):
    print(f"{name} {value:.3f} {unit}", flush=True)


def ms_since(start):
    return (time.perf_counter() - start) * 1e3


def wait_steady(max_s=30.0, steady_s=3.0, poll_s=0.5):
    """Waits until the cluster's process count has not changed for steady_s."""
    me = os.getpid()
    deadline = time.monotonic() + max_s
    last, since = None, time.monotonic()
    while time.monotonic() < deadline:
        n = len(descendants(me))
        if n != last:
            last, since = n, time.monotonic()
        elif time.monotonic() - since >= steady_s:
            break
        time.sleep(poll_s)


@ray.remote
def tiny():
    return b"ok"


@ray.remote
def total(x):
    return float(x.sum())


@ray.remote(num_cpus=0)
class Actor:
    def small_value(self):
        return b"ok"


@ray.remote(num_returns="streaming")
def small_values_streamed(n):
    for _ in range(n):
        yield b"ok"


def rate(fn, multiplier, quick):
    """Calls per second times `multiplier`, as `timeit` in Prism's
    microbenchmark: a warm-up, then the mean rate of trials."""
    warmup, trial, trials = (0.02, 0.1, 1) if quick else (0.5, 2.0, 3)
    start = time.perf_counter()
    fn()
    while time.perf_counter() - start < warmup:
        fn()
    rates = []
    for _ in range(trials):
        start = time.perf_counter()
        calls = 0
        while calls == 0 or time.perf_counter() - start < trial:
            fn()
            calls += 1
        rates.append(calls * multiplier / (time.perf_counter() - start))
    return statistics.mean(rates)


def read_stream():
    for ref in small_values_streamed.remote(1000):
        ray.get(ref)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    args = parser.parse_args()
    put_rounds = 3 if args.quick else 10
    worker_rounds = 2 if args.quick else 5

    rng = np.random.default_rng(0)
    arr = rng.random(MB100_FLOATS, dtype=np.float32)
    assert arr.nbytes == 100_000_000

    start = time.perf_counter()
    ray.init()
    report("cluster_start", ms_since(start), "ms")
    try:
        start = time.perf_counter()
        ray.get(tiny.remote())
        report("first_task_latency", ms_since(start), "ms")

        start = time.perf_counter()
        actor = Actor.remote()
        ray.get(actor.small_value.remote())
        report("actor_creation_plus_first_call", ms_since(start), "ms")

        # A worker that has already run this task on this ref: the row times
        # the hand-over of the argument and the sum, not a worker's start or
        # numpy's import.
        ref = ray.put(arr)
        expected = float(arr.sum())
        ray.get(total.remote(ref))
        times = []
        for _ in range(worker_rounds):
            start = time.perf_counter()
            result = ray.get(total.remote(ref))
            times.append(ms_since(start))
            if abs(result - expected) > 1e-3 * abs(expected):
                raise RuntimeError(f"task sum {result} != driver sum {expected}")
        report("get_100mb_in_worker_ms", statistics.median(times), "ms")
        del ref

        rates = []
        for _ in range(put_rounds):
            start = time.perf_counter()
            ref = ray.put(arr)
            rates.append(0.1 / (time.perf_counter() - start))
            del ref
            time.sleep(0.02)  # let the store see the delete before the next put
        report("put_100mb_random_gigabytes", statistics.median(rates[1:]), "GB_per_s")
        del actor

        report("single_client_streaming_values", rate(read_stream, 1000, args.quick), "per_s")
    finally:
        start = time.perf_counter()
        ray.shutdown()
    report("cluster_shutdown", ms_since(start), "ms")

    # The idle node is measured without the 100 MB array in the driver.
    del arr
    ray.init()
    try:
        wait_steady()
        pids = descendants(os.getpid())
        report("idle_node_processes", len(pids), "processes")
        report("idle_node_pss", sum(pss_kib(p) for p in pids) / 1024.0, "MiB")
    finally:
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
