"""torch.distributed gloo collectives on the sizes and world sizes that
collective/examples/collective_bench.rs uses, timed the same way: two warm-up
calls, a barrier, then the median of single calls on rank 0. The size and
busbw follow nccl-tests, as there: the whole buffer (all-gather's output,
reduce-scatter's input, rounded down to a multiple of the world size), and
busbw = algbw x 2(n-1)/n for all_reduce, x (n-1)/n for all_gather and
reduce_scatter, x 1 for broadcast (from rank 1, so that rank 0 receives).

Prints rows `gloo  tcp  <world>  <bytes>  <time_us>  <algbw>  <busbw>`.

    python gloo_allreduce.py [--op all_reduce|all_gather|reduce_scatter|broadcast] \
        --worlds 2,4 --min-bytes 4096 --max-bytes 268435456 [--device cuda]

With --device cuda the tensors live on GPU 0 (every rank shares it) and gloo
stages them through host memory itself.
"""

import argparse
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def iterations(nbytes):
    if nbytes <= 1 << 20:
        return 100
    if nbytes <= 16 << 20:
        return 20
    if nbytes <= 64 << 20:
        return 8
    return 5


def sizes(lo, hi):
    s = max(lo, 4)
    while s <= hi:
        yield s
        s *= 4


BUS_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1,
}


def make_call(op, rank, world, nbytes, device):
    """The timed call on fresh buffers, the bytes it counts, and a check of
    the first call's result."""
    elems = max(nbytes // 4, 1)
    part = max(elems // world, 1)
    f32 = dict(dtype=torch.float32, device=device)
    if op == "all_reduce":
        t = torch.ones(elems, **f32)
        return (lambda: dist.all_reduce(t)), elems * 4, lambda: t[0].item() == world
    if op == "all_gather":
        mine = torch.full((part,), float(rank + 1), **f32)
        out = torch.zeros(part * world, **f32)
        return (lambda: dist.all_gather_into_tensor(out, mine)), part * world * 4, lambda: out[-1].item() == world
    if op == "reduce_scatter":
        inp = torch.ones(part * world, **f32)
        out = torch.zeros(part, **f32)
        return (lambda: dist.reduce_scatter_tensor(out, inp)), part * world * 4, lambda: out[0].item() == world
    root = 1 % world
    t = torch.full((elems,), float(rank + 1), **f32)
    return (lambda: dist.broadcast(t, root)), elems * 4, lambda: t[-1].item() == root + 1


def rank_main(rank, world, port, lo, hi, queue, device, op):
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    for size in sizes(lo, hi):
        call, nbytes, check = make_call(op, rank, world, size, device)
        call()
        assert check(), f"gloo {op} gave a wrong result"
        call()
        dist.barrier()
        times = []
        for _ in range(iterations(nbytes)):
            start = time.perf_counter()
            call()
            if device == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        if rank == 0:
            queue.put((nbytes, statistics.median(times)))
    dist.barrier()
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--worlds", default="2,4")
    p.add_argument("--min-bytes", type=int, default=4096)
    p.add_argument("--max-bytes", type=int, default=256 << 20)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--op", default="all_reduce", choices=sorted(BUS_FACTOR))
    a = p.parse_args()
    ctx = mp.get_context("spawn")
    print(f"# torch {torch.__version__} gloo", flush=True)
    print(f"# op {a.op}", flush=True)
    for world in [int(w) for w in a.worlds.split(",")]:
        queue = ctx.Queue()
        port = free_port()
        procs = [
            ctx.Process(
                target=rank_main,
                args=(r, world, port, a.min_bytes, a.max_bytes, queue, a.device, a.op),
            )
            for r in range(world)
        ]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join(timeout=900)
            if proc.exitcode != 0:
                for other in procs:
                    other.kill()
                sys.exit(f"gloo rank failed at world {world}: exit {proc.exitcode}")
        while not queue.empty():
            nbytes, secs = queue.get()
            algbw = nbytes / secs / 1e9
            busbw = algbw * BUS_FACTOR[a.op](world)
            label = "gloo-cuda" if a.device == "cuda" else "gloo  "
            print(f"{label} tcp   {world}  {nbytes:>10}  {secs * 1e6:>10.1f}  {algbw:>8.3f}  {busbw:>8.3f}", flush=True)


if __name__ == "__main__":
    main()
