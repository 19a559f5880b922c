"""Ray's side of bench/cluster/vs_ray.sh: the rows examples/cluster_bench.rs
measures on Prism, on Ray's own three-node cluster on one machine
(ray.cluster_utils.Cluster, one CPU per node, the driver on the head).
Each figure is printed as `ROW <name> <value> <unit>`.

    python bench/cluster/ray_side.py
"""

import statistics
import time

import numpy as np
import ray
from ray.cluster_utils import Cluster
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

ROUND_TRIPS = 1000
SPREAD_TASKS = 3000
BIG = 100_000_000


def row(name, value, unit):
    print(f"ROW {name} {value:.3f} {unit}", flush=True)


@ray.remote(num_cpus=1)
def noop():
    return 0


@ray.remote(num_cpus=1)
def make(size):
    return np.ones(size, dtype=np.uint8)


@ray.remote(num_cpus=1)
def consume(data):
    return len(data)


@ray.remote(num_cpus=0)
class Echo:
    def ping(self):
        return 0


def on(node_id):
    return NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)


def median_ms(samples):
    return statistics.median(samples) * 1e3


def task_round_trip(node_id):
    f = noop.options(scheduling_strategy=on(node_id))
    for _ in range(100):
        ray.get(f.remote())
    samples = []
    for _ in range(ROUND_TRIPS):
        t = time.perf_counter()
        ray.get(f.remote())
        samples.append(time.perf_counter() - t)
    return median_ms(samples)


def made_on(node_id):
    ref = make.options(scheduling_strategy=on(node_id)).remote(BIG)
    ray.wait([ref], fetch_local=False)
    return ref


def main():
    started = time.perf_counter()
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1},
    )
    for _ in range(2):
        cluster.add_node(num_cpus=1)
    ray.init(address=cluster.address)
    cluster.wait_for_nodes()
    row("3 nodes up and driver init", (time.perf_counter() - started) * 1e3, "ms")

    here = ray.get_runtime_context().get_node_id()
    others = [n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeID"] != here]
    b, c = others[0], others[1]

    row("task round trip, same node", task_round_trip(here), "ms")
    row("task round trip, other node", task_round_trip(b), "ms")

    spread = noop.options(scheduling_strategy="SPREAD")

    def burst(n):
        t = time.perf_counter()
        ray.get([spread.remote() for _ in range(n)])
        return n / (time.perf_counter() - t)

    burst(300)
    row("SPREAD tasks over 3 nodes", burst(SPREAD_TASKS), "tasks/s")

    made = made_on(b)
    for label in ["first", "again"]:
        t = time.perf_counter()
        n = ray.get(consume.options(scheduling_strategy=on(c)).remote(made))
        ms = (time.perf_counter() - t) * 1e3
        assert n == BIG
        row(f"100 MB made on B used by a task on C ({label})", ms, "ms")
    del made

    samples = []
    for _ in range(3):
        made = made_on(b)
        t = time.perf_counter()
        data = ray.get(made)
        samples.append(time.perf_counter() - t)
        assert len(data) == BIG
        del data, made
    row("driver get of 100 MB from another node", median_ms(samples), "ms")

    echo = Echo.options(scheduling_strategy=on(b)).remote()
    for _ in range(100):
        ray.get(echo.ping.remote())
    samples = []
    for _ in range(ROUND_TRIPS):
        t = time.perf_counter()
        ray.get(echo.ping.remote())
        samples.append(time.perf_counter() - t)
    row("sync actor call, other node", median_ms(samples), "ms")
    del echo

    t = time.perf_counter()
    ray.shutdown()
    cluster.shutdown()
    row("driver shutdown", (time.perf_counter() - t) * 1e3, "ms")


if __name__ == "__main__":
    main()
