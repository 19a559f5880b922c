"""The Jobs API of one head, measured through its REST routes: the same
script measures a Prism head and a Ray head (both serve Ray's routes).

    python jobs_bench.py --address http://127.0.0.1:8265 --token T --runs 20 --jobs 100

Prints one line per row, `name min median max` (milliseconds, or MB for
the memory rows):

- submit_ms: the POST /api/jobs/ call alone;
- to_running_ms: from before the POST until GET /api/jobs/{id} says
  RUNNING (polled every 5 ms), for `sleep 1`;
- to_succeeded_ms: the same until SUCCEEDED, for `echo hello`;
- jobs_all_running_s: --jobs `sleep 600` jobs submitted at once (16
  threads), until every one is RUNNING (its min/median/max are one
  figure); then each is stopped, and every one must end STOPPED;
- head_pss_per_running_job_mb: the machine's PSS (every process but the
  jobs' own `sleep` and this script) while the jobs run, less the PSS
  before they were submitted, divided by --jobs.
"""

import argparse
import concurrent.futures
import os
import statistics
import sys
import time

import requests

TERMINAL = {"SUCCEEDED", "FAILED", "STOPPED"}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--address", required=True)
    p.add_argument("--token", required=True)
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--jobs", type=int, default=100)
    a = p.parse_args()
    s = requests.Session()
    s.headers["Authorization"] = f"Bearer {a.token}"
    base = a.address.rstrip("/")

    def submit(entrypoint):
        r = s.post(f"{base}/api/jobs/", json={"entrypoint": entrypoint})
        r.raise_for_status()
        return r.json()["submission_id"]

    def status(job):
        r = s.get(f"{base}/api/jobs/{job}")
        r.raise_for_status()
        return r.json()["status"]

    def until(job, wanted, limit=60.0):
        deadline = time.perf_counter() + limit
        while True:
            st = status(job)
            if st in wanted:
                return st
            if time.perf_counter() > deadline:
                sys.exit(f"job {job} still {st} after {limit} s")
            time.sleep(0.005)

    rows = {"submit_ms": [], "to_running_ms": [], "to_succeeded_ms": []}
    for _ in range(a.runs):
        t0 = time.perf_counter()
        job = submit("sleep 1")
        rows["submit_ms"].append((time.perf_counter() - t0) * 1e3)
        until(job, {"RUNNING"} | TERMINAL)
        rows["to_running_ms"].append((time.perf_counter() - t0) * 1e3)
        t0 = time.perf_counter()
        job = submit("echo hello")
        st = until(job, TERMINAL)
        if st != "SUCCEEDED":
            sys.exit(f"echo hello ended {st}")
        rows["to_succeeded_ms"].append((time.perf_counter() - t0) * 1e3)
    for name, values in rows.items():
        print(f"{name} {min(values):.1f} {statistics.median(values):.1f} {max(values):.1f}")

    def machine_pss_mb():
        # /proc/<pid>/smaps_rollup's Pss, in kB (readable for every process
        # as root; others' are skipped).
        total_kb = 0
        me = str(os.getpid())
        for pid in os.listdir("/proc"):
            if not pid.isdigit() or pid == me:
                continue
            try:
                with open(f"/proc/{pid}/comm") as f:
                    if f.read().strip() == "sleep":
                        continue
                with open(f"/proc/{pid}/smaps_rollup") as f:
                    for line in f:
                        if line.startswith("Pss:"):
                            total_kb += int(line.split()[1])
                            break
            except OSError:
                pass
        return total_kb / 1e3

    time.sleep(3)  # the runs above have ended
    before = machine_pss_mb()
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        jobs = list(pool.map(lambda _: submit("sleep 600"), range(a.jobs)))
    # Every job running, then the memory.
    for job in jobs:
        st = until(job, {"RUNNING"} | TERMINAL, limit=600)
        if st != "RUNNING":
            sys.exit(f"job {job} ended {st} before it was stopped")
    took = time.perf_counter() - t0
    during = machine_pss_mb()
    for job in jobs:
        s.post(f"{base}/api/jobs/{job}/stop").raise_for_status()
    ended = [until(job, TERMINAL, limit=600) for job in jobs]
    if any(st != "STOPPED" for st in ended):
        sys.exit(f"of {a.jobs} jobs, {sum(st != 'STOPPED' for st in ended)} did not end STOPPED")
    print(f"jobs_all_running_s {took:.1f} {took:.1f} {took:.1f}")
    per = (during - before) / a.jobs
    print(f"head_pss_per_running_job_mb {per:.2f} {per:.2f} {per:.2f}")


if __name__ == "__main__":
    main()
