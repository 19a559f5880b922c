"""torch.distributed gloo all_reduce on the sizes and world sizes that
collective/examples/collective_bench.rs uses, timed the same way: two warm-up
calls, a barrier, then the median of single calls on rank 0.

Prints rows `gloo  tcp  <world>  <bytes>  <time_us>  <algbw>  <busbw>`.

    python gloo_allreduce.py --worlds 2,4 --min-bytes 4096 --max-bytes 268435456 [--device cuda]

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


def rank_main(rank, world, port, lo, hi, queue, device):
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    for nbytes in sizes(lo, hi):
        t = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
        dist.all_reduce(t)
        assert t[0].item() == world, "gloo all_reduce gave a wrong sum"
        dist.all_reduce(t)
        dist.barrier()
        times = []
        for _ in range(iterations(nbytes)):
            start = time.perf_counter()
            dist.all_reduce(t)
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
    a = p.parse_args()
    ctx = mp.get_context("spawn")
    print(f"# torch {torch.__version__} gloo", flush=True)
    for world in [int(w) for w in a.worlds.split(",")]:
        queue = ctx.Queue()
        port = free_port()
        procs = [
            ctx.Process(
                target=rank_main,
                args=(r, world, port, a.min_bytes, a.max_bytes, queue, a.device),
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
            busbw = algbw * 2 * (world - 1) / world
            label = "gloo-cuda" if a.device == "cuda" else "gloo  "
            print(f"{label} tcp   {world}  {nbytes:>10}  {secs * 1e6:>10.1f}  {algbw:>8.3f}  {busbw:>8.3f}", flush=True)


if __name__ == "__main__":
    main()
