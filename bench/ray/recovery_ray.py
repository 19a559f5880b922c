"""Ray's side of examples/recovery.rs: how fast Ray recovers when a process
is killed, measured the same way.

- task_retry_after_kill: a task's worker is SIGKILLed while the task runs;
  the time from the kill until ray.get returns the retried task's result
  (the retry returns at once).
- actor_restart_after_kill: an actor with max_restarts=-1 has its process
  SIGKILLed; the time from the kill until a call answers again.

Prints `name_ms min median max` lines, as the Prism example does.

    python bench/ray/recovery_ray.py [--runs N]
"""

import argparse
import os
import signal
import statistics
import tempfile
import time

import ray

LIMIT_S = 30.0


@ray.remote(max_retries=3)
def hold(marker):
    if os.path.exists(marker):
        return os.getpid()
    with open(marker, "w") as f:
        f.write(str(os.getpid()))
    time.sleep(60)
    return 0


@ray.remote(max_restarts=-1)
class Pinger:
    def pid(self):
        return os.getpid()

    def ping(self):
        return 1


def running_pid(marker):
    deadline = time.monotonic() + LIMIT_S
    while time.monotonic() < deadline:
        try:
            with open(marker) as f:
                text = f.read().strip()
            if text:
                return int(text)
        except (FileNotFoundError, ValueError):
            pass
        time.sleep(0.001)
    raise RuntimeError(f"the task did not start within {LIMIT_S} s")


def task_retry(folder, run):
    marker = os.path.join(folder, f"task-{run}")
    ref = hold.remote(marker)
    pid = running_pid(marker)
    killed = time.perf_counter()
    os.kill(pid, signal.SIGKILL)
    answer = ray.get(ref, timeout=LIMIT_S)
    took = time.perf_counter() - killed
    if answer == pid:
        raise RuntimeError("the result came from the killed process")
    return took


def actor_restart(pinger):
    pid = ray.get(pinger.pid.remote())
    killed = time.perf_counter()
    os.kill(pid, signal.SIGKILL)
    deadline = killed + LIMIT_S
    while True:
        try:
            ray.get(pinger.ping.remote(), timeout=LIMIT_S)
            return time.perf_counter() - killed
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError):
            if time.perf_counter() > deadline:
                raise


def summary(name, samples):
    samples = sorted(samples)
    ms = [s * 1e3 for s in samples]
    print(f"{name}_ms {ms[0]:.1f} {ms[len(ms) // 2]:.1f} {ms[-1]:.1f}", flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    if args.runs <= 0:
        parser.error("--runs must be a positive count")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    with tempfile.TemporaryDirectory(prefix="ray-recovery-") as folder:
        summary("task_retry_after_kill", [task_retry(folder, r) for r in range(args.runs)])
        pinger = Pinger.remote()
        ray.get(pinger.ping.remote())
        summary("actor_restart_after_kill", [actor_restart(pinger) for _ in range(args.runs)])
    ray.shutdown()


if __name__ == "__main__":
    main()
