#!/usr/bin/env python3
"""How fast the state API answers with a large task table.

Starts a head (`prism start --head`, loopback, free ports) that keeps
`--kept` tasks (PRISM_TASK_EVENTS_KEPT), fills its table by running the
microbenchmark's task rows against it until the table holds that many (or
`--load-seconds` pass), then times, each `--rounds` times:

- `GET /api/v0/tasks?limit=1000` on the dashboard (one HTTP request),
- `prism list tasks --limit 1000 --format json` (the whole command),
- what the dashboard's Tasks view asks for when it loads
  (`/api/v0/tasks/summarize` and `/api/v0/tasks?limit=500`, one after the
  other) and the page itself (`GET /`),
- `prism stack` while the load runs again (every thread of every worker,
  named).

Prints one line per measure: its median and range in milliseconds. The
head is stopped at the end (`prism stop --force`), whatever happens.

    cargo build --release -p prism-cli --example microbenchmark
    python3 bench/observability/state_api.py [--kept 100000] [--rounds 20]
"""

import argparse
import glob
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def target_dir():
    if os.environ.get("CARGO_TARGET_DIR"):
        return os.environ["CARGO_TARGET_DIR"]
    meta = subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--no-deps"],
        capture_output=True, text=True, check=True)
    return json.loads(meta.stdout)["target_directory"]


def get(dashboard, token, path):
    host, port = dashboard.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.request("GET", path, headers={"Authorization": "Bearer " + token})
    answer = conn.getresponse()
    body = answer.read()
    conn.close()
    if answer.status != 200:
        raise RuntimeError(f"{path}: {answer.status} {body[:200]!r}")
    return body


def timed(rounds, action):
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        action()
        times.append((time.perf_counter() - start) * 1000)
    return times


def report(name, times):
    print(f"{name}: median {statistics.median(times):.1f} ms "
          f"(min {min(times):.1f}, max {max(times):.1f}, {len(times)} rounds)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kept", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--load-seconds", type=float, default=240)
    args = parser.parse_args()
    release = os.path.join(target_dir(), "release")
    prism = os.path.join(release, "prism")
    bench = os.path.join(release, "examples", "microbenchmark")
    for path in (prism, bench):
        if not os.access(path, os.X_OK):
            sys.exit(f"{path} is missing: cargo build --release -p prism-cli "
                     "--example microbenchmark")
    temp = tempfile.mkdtemp(prefix="prism-state-bench-")
    env = dict(os.environ, PRISM_TASK_EVENTS_KEPT=str(args.kept))
    for name in ("PRISM_ADDRESS", "PRISM_AUTH_TOKEN", "PRISM_TEMP_DIR"):
        env.pop(name, None)
    subprocess.run([prism, "start", "--head", "--port", "0", "--dashboard-port", "0",
                    "--num-cpus", "2", "--node-ip-address", "127.0.0.1",
                    "--temp-dir", temp], env=env, check=True, timeout=120,
                   stdout=subprocess.DEVNULL)
    try:
        record = None
        for path in glob.glob(os.path.join(temp, "nodes", "*.json")):
            with open(path) as f:
                r = json.load(f)
            if r.get("is_head"):
                record = r
        if record is None:
            sys.exit("the head wrote no node record")
        dashboard, head = record["dashboard"], record["head"]
        with open(os.path.join(temp, "token")) as f:
            token = f.read().strip()
        cli_env = dict(env, PRISM_ADDRESS="http://" + dashboard, PRISM_AUTH_TOKEN=token)

        def kept():
            body = json.loads(get(dashboard, token, "/api/v0/tasks?limit=1"))
            return body["data"]["result"]["total"]

        load_env = dict(env, PRISM_ADDRESS=head, PRISM_AUTH_TOKEN=token,
                        PRISM_TEMP_DIR=temp, PRISM_BENCH_ROWS="tasks_async")
        deadline = time.monotonic() + args.load_seconds
        while kept() < args.kept and time.monotonic() < deadline:
            run = subprocess.run([bench], env=load_env, timeout=600,
                                 capture_output=True, text=True)
            if run.returncode != 0:
                sys.exit(f"the load did not run: {run.stderr.strip()[-500:]}")
        time.sleep(2)
        total = kept()
        print(f"tasks kept on the node: {total} (asked for {args.kept})")

        report("GET /api/v0/tasks?limit=1000",
               timed(args.rounds, lambda: get(dashboard, token, "/api/v0/tasks?limit=1000")))
        report("prism list tasks --limit 1000 --format json",
               timed(args.rounds, lambda: subprocess.run(
                   [prism, "list", "tasks", "--limit", "1000", "--format", "json",
                    "--temp-dir", temp], env=cli_env, check=True, timeout=60,
                   stdout=subprocess.DEVNULL)))

        def tasks_view():
            get(dashboard, token, "/")
            get(dashboard, token, "/api/v0/tasks/summarize")
            get(dashboard, token, "/api/v0/tasks?limit=500")
        report("dashboard Tasks view (page, summary, 500 tasks)", timed(args.rounds, tasks_view))

        # A worker to dump: the load's, while it runs.
        load = subprocess.Popen([bench], env=load_env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        try:
            pids = []
            until = time.monotonic() + 30
            while not pids and time.monotonic() < until:
                workers = json.loads(get(dashboard, token, "/api/v0/workers?limit=100"))
                pids = [w["pid"] for w in workers["data"]["result"]["result"]
                        if w.get("pid") and w.get("state") in ("IDLE", "LEASED")]
                time.sleep(0.2)
            if pids:
                report(f"prism stack (every worker of the node, {len(pids)} or more)",
                       timed(max(3, args.rounds // 4), lambda: subprocess.run(
                           [prism, "stack", "--temp-dir", temp],
                           env=cli_env, check=True, timeout=60,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)))
            else:
                print("prism stack: no worker came up to dump")
        finally:
            load.kill()
            load.wait()
    finally:
        subprocess.run([prism, "stop", "--force", "--temp-dir", temp], env=env,
                       timeout=60, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


if __name__ == "__main__":
    main()
