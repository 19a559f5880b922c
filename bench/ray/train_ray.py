#!/usr/bin/env python3
"""Ray Train's side of the training comparison (train_compare.sh).

The two trainings of train/examples/, done with Ray's TorchTrainer and the
same settings:

  linear-regression  Linear(1, 32), ReLU, Linear(32, 1); Adam, lr 0.01,
                     weight decay 0.01; MSE; batch 32; y = 2x + 1 for
                     x = 0..200 as a Ray Dataset (`ray.data.from_items`),
                     split equally over the workers; 200 epochs; a report of
                     {epoch, loss of the last batch} every epoch with rank 0's
                     model as checkpoint, num_to_keep 1; torch.manual_seed(42)
                     before the model is made. Asserts final loss <= 0.09.
  fashion-mnist      MLP 784-256-128-10, ReLU; Adam, lr 1e-3; cross-entropy;
                     batch 64 per worker; 4 epochs; each worker reads the file
                     of scripts/fetch-dataset.sh itself (every 7th image of a
                     class, by index within the class, is test) and takes its
                     part through a DistributedSampler (seed 7, set_epoch every
                     epoch); test accuracy every epoch, all-reduced over the
                     workers; checkpoints kept by val_accuracy, num_to_keep 2.
                     Asserts test accuracy >= 0.85.

Every worker uses one intra-op thread (torch.set_num_threads(1)), as Ray
gives 1-CPU workers OMP_NUM_THREADS=1 and the Prism examples set.

--trainer v2 (Ray's default, Train V2) or v1 (the legacy trainer:
RAY_TRAIN_V2_ENABLED=0, and trainer_resources={"CPU": 0}, without which it
does not start when the workers take every CPU). Train V2's controller polls
the workers every RAY_TRAIN_HEALTH_CHECK_INTERVAL_S seconds (default 2.0)
and a worker's report waits for that poll; --poll S sets it.

The cluster is `ray.init(num_cpus=max(workers, 2))`, as the Prism examples
start theirs. Output: the usual Ray logs on stderr, then `key value` lines on
stdout:

  import_s      importing ray, ray.train, torch
  init_s        ray.init()
  fit_s         trainer.fit()
  wall_s        ray.init() + fit (what the Prism examples time)
  per_epoch_ms  wall_s / epochs (the Prism examples' "time per epoch")
  steady_epoch_ms  rank 0's time from the end of the first epoch's report to
                the end of the last, over epochs - 1
  loss / val_accuracy  the last report's
  shutdown_s    ray.shutdown()

Exit status 1 when the final loss or accuracy misses its bar (the figures are
printed first).
"""

import argparse
import os
import sys
import time


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("workload", choices=["linear-regression", "fashion-mnist"])
    p.add_argument("--trainer", choices=["v1", "v2"], default="v2")
    p.add_argument("--poll", type=float, default=None,
                   help="Train V2 controller poll, seconds (Ray's default 2.0)")
    p.add_argument("--workers", type=int, default=None,
                   help="default 3 (linear-regression), 2 (fashion-mnist)")
    p.add_argument("--epochs", type=int, default=None,
                   help="default 200 (linear-regression), 4 (fashion-mnist)")
    p.add_argument("--seed", type=int, default=None,
                   help="default 42 (linear-regression), 7 (fashion-mnist)")
    p.add_argument("--data", default=None,
                   help="fashion-mnist: the file of scripts/fetch-dataset.sh "
                        "(default $PRISM_DATA_DIR or ~/.cache/prism/datasets, fashion-mnist.bin)")
    return p.parse_args()


ARGS = parse_args()
# Read when ray.train is imported (V1/V2) and when the controller starts (poll).
os.environ["RAY_TRAIN_V2_ENABLED"] = "1" if ARGS.trainer == "v2" else "0"
if ARGS.poll is not None:
    os.environ["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"] = str(ARGS.poll)
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

started = time.perf_counter()
import numpy as np  # noqa: E402
import ray  # noqa: E402
import ray.train  # noqa: E402
import ray.train.torch  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from ray.train import Checkpoint, CheckpointConfig, RunConfig, ScalingConfig  # noqa: E402
from ray.train.torch import TorchTrainer  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DistributedSampler  # noqa: E402

IMPORT_S = time.perf_counter() - started


def save_checkpoint(model, epoch, folder):
    """Rank 0's checkpoint: the model's weights and the epoch."""
    module = model.module if hasattr(model, "module") else model
    torch.save(module.state_dict(), os.path.join(folder, "model.pt"))
    with open(os.path.join(folder, "epoch"), "w") as f:
        f.write(str(epoch))
    return Checkpoint.from_directory(folder)


def mark_epoch(config):
    """Rank 0 notes when each epoch's report returned (steady_epoch_ms)."""
    if ray.train.get_context().get_world_rank() == 0:
        with open(config["marks"], "a") as f:
            f.write(f"{time.time()}\n")


# --- linear regression -------------------------------------------------------

def linear_regression_loop(config):
    torch.set_num_threads(1)
    shard = ray.train.get_dataset_shard("train")
    rank = ray.train.get_context().get_world_rank()
    torch.manual_seed(config["seed"])
    model = nn.Sequential(nn.Linear(1, config["hidden"]), nn.ReLU(),
                          nn.Linear(config["hidden"], 1))
    model = ray.train.torch.prepare_model(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=config["lr"],
                                 weight_decay=config["weight_decay"])
    loss_fn = nn.MSELoss()
    for epoch in range(config["epochs"]):
        loss_value = float("nan")
        for batch in shard.iter_torch_batches(batch_size=config["batch_size"],
                                              dtypes=torch.float32):
            x, y = batch["x"].unsqueeze(1), batch["y"].unsqueeze(1)
            loss = loss_fn(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            loss_value = loss.item()
        metrics = {"epoch": epoch, "loss": loss_value}
        if rank == 0:
            with _staging() as folder:
                ray.train.report(metrics, checkpoint=save_checkpoint(model, epoch, folder))
        else:
            ray.train.report(metrics)
        mark_epoch(config)


def _staging():
    import tempfile
    return tempfile.TemporaryDirectory(prefix="ray-train-ckpt-")


def linear_regression(args, storage, marks):
    train = ray.data.from_items(
        [{"x": float(x), "y": 2.0 * x + 1.0} for x in range(200)])
    config = {"epochs": args.epochs, "batch_size": 32, "lr": 0.01,
              "weight_decay": 0.01, "hidden": 32, "seed": args.seed,
              "marks": marks}
    trainer = TorchTrainer(
        linear_regression_loop,
        train_loop_config=config,
        scaling_config=scaling_config(args),
        run_config=RunConfig(
            name=f"linear_regression_{os.getpid()}", storage_path=storage,
            checkpoint_config=CheckpointConfig(num_to_keep=1)),
        datasets={"train": train},
    )
    return trainer


# --- fashion-mnist -----------------------------------------------------------

PIXELS = 784


def load_images(path):
    """(pixels as uint8 [n, 784], labels, peak, train indices, test indices)."""
    raw = np.fromfile(path, dtype=np.uint8)
    if raw.size < 21 or raw[:8].tobytes() != b"PRISMDS1":
        raise SystemExit(f"{path} is not a dataset written by scripts/fetch-dataset.sh")
    n = int(raw[8:12].view("<u4")[0])
    peak = float(raw[20])
    labels = raw[21:21 + n].astype(np.int64)
    pixels = raw[21 + n:]
    if pixels.size != n * PIXELS:
        raise SystemExit(f"{path} is truncated: {pixels.size} pixel bytes for {n} images")
    seen = [0] * 10
    train, test = [], []
    for i, label in enumerate(labels.tolist()):
        (test if seen[label % 10] % 7 == 6 else train).append(i)
        seen[label % 10] += 1
    return pixels.reshape(n, PIXELS), labels, peak, np.array(train), np.array(test)


def fashion_mnist_loop(config):
    torch.set_num_threads(1)
    torch.manual_seed(config["seed"])
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    pixels, labels, peak, train, test = load_images(config["data"])

    def batch(indices):
        x = torch.from_numpy(pixels[indices].astype(np.float32) / peak)
        return x, torch.from_numpy(labels[indices])

    model = nn.Sequential(nn.Linear(PIXELS, 256), nn.ReLU(), nn.Linear(256, 128),
                          nn.ReLU(), nn.Linear(128, 10))
    model = ray.train.torch.prepare_model(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=config["lr"])
    loss_fn = nn.CrossEntropyLoss()
    sampler = DistributedSampler(range(len(train)), num_replicas=world, rank=rank,
                                 shuffle=True, seed=config["seed"])
    mine = test[rank::world]
    for epoch in range(config["epochs"]):
        sampler.set_epoch(epoch)
        order = np.fromiter(sampler, dtype=np.int64)
        loss_sum, steps = 0.0, 0
        model.train()
        for start in range(0, len(order), config["batch_size"]):
            x, y = batch(train[order[start:start + config["batch_size"]]])
            loss = loss_fn(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            loss_sum += loss.item()
            steps += 1
        # Validation: each rank scores its part of the test set; the counts
        # are summed over the group.
        model.eval()
        correct = 0
        with torch.no_grad():
            for start in range(0, len(mine), 1000):
                x, y = batch(mine[start:start + 1000])
                correct += int((model(x).argmax(-1) == y).sum())
        counts = torch.tensor([correct, len(mine), loss_sum / max(steps, 1) / world],
                              dtype=torch.float64)
        dist.all_reduce(counts)
        metrics = {"epoch": epoch, "loss": float(counts[2]),
                   "val_accuracy": float(counts[0] / counts[1])}
        if rank == 0:
            with _staging() as folder:
                ray.train.report(metrics, checkpoint=save_checkpoint(model, epoch, folder))
        else:
            ray.train.report(metrics)
        mark_epoch(config)


def fashion_mnist(args, storage, marks):
    data = args.data or os.path.join(
        os.environ.get("PRISM_DATA_DIR", os.path.expanduser("~/.cache/prism/datasets")),
        "fashion-mnist.bin")
    if not os.path.exists(data):
        raise SystemExit(f"{data}: no such file; run scripts/fetch-dataset.sh fashion-mnist first")
    config = {"data": data, "epochs": args.epochs, "batch_size": 64, "lr": 1e-3,
              "seed": args.seed, "marks": marks}
    return TorchTrainer(
        fashion_mnist_loop,
        train_loop_config=config,
        scaling_config=scaling_config(args),
        run_config=RunConfig(
            name=f"fashion_mnist_{os.getpid()}", storage_path=storage,
            checkpoint_config=CheckpointConfig(
                num_to_keep=2, checkpoint_score_attribute="val_accuracy",
                checkpoint_score_order="max")),
    )


# --- driver ------------------------------------------------------------------

def scaling_config(args):
    if args.trainer == "v1":
        # The legacy trainer actor asks for 1 CPU by default; with every CPU
        # taken by a worker it would never be scheduled.
        return ScalingConfig(num_workers=args.workers, use_gpu=False,
                             trainer_resources={"CPU": 0})
    return ScalingConfig(num_workers=args.workers, use_gpu=False)


def main():
    import shutil
    import tempfile

    args = ARGS
    lr = args.workload == "linear-regression"
    args.workers = args.workers or (3 if lr else 2)
    args.epochs = args.epochs or (200 if lr else 4)
    args.seed = args.seed if args.seed is not None else (42 if lr else 7)
    storage = tempfile.mkdtemp(prefix="ray-train-results-")
    marks = os.path.join(storage, "epoch-marks")
    try:
        t0 = time.perf_counter()
        ray.init(num_cpus=max(args.workers, 2))
        init_s = time.perf_counter() - t0
        build = linear_regression if lr else fashion_mnist
        t1 = time.perf_counter()
        result = build(args, storage, marks).fit()
        fit_s = time.perf_counter() - t1
        wall_s = time.perf_counter() - t0
        if result.error:
            raise result.error
        metrics = result.metrics or {}
        with open(marks) as f:
            stamps = [float(line) for line in f if line.strip()]
        steady_ms = (1000 * (stamps[-1] - stamps[0]) / (len(stamps) - 1)
                     if len(stamps) > 1 else float("nan"))
        t2 = time.perf_counter()
        ray.shutdown()
        shutdown_s = time.perf_counter() - t2
    finally:
        shutil.rmtree(storage, ignore_errors=True)

    poll = os.environ.get("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "2.0 (default)")
    out = [
        ("system", f"ray-train-{args.trainer}"),
        ("ray_version", ray.__version__),
        ("torch_version", torch.__version__),
        ("workers", args.workers),
        ("epochs", args.epochs),
        ("poll_s", poll if args.trainer == "v2" else "n/a"),
        ("reports", len(stamps)),
        ("import_s", f"{IMPORT_S:.3f}"),
        ("init_s", f"{init_s:.3f}"),
        ("fit_s", f"{fit_s:.3f}"),
        ("wall_s", f"{wall_s:.3f}"),
        ("per_epoch_ms", f"{1000 * wall_s / args.epochs:.1f}"),
        ("steady_epoch_ms", f"{steady_ms:.1f}"),
        ("shutdown_s", f"{shutdown_s:.3f}"),
    ]
    if lr:
        out.append(("loss", f"{metrics.get('loss', float('nan')):.5f}"))
    else:
        out.append(("loss", f"{metrics.get('loss', float('nan')):.5f}"))
        out.append(("val_accuracy", f"{metrics.get('val_accuracy', 0.0):.4f}"))
    for key, value in out:
        print(f"{key} {value}", flush=True)

    if lr:
        loss = metrics.get("loss", float("nan"))
        if not loss <= 0.09:
            print(f"train_ray.py: final loss {loss} is above 0.09", file=sys.stderr)
            return 1
    else:
        accuracy = metrics.get("val_accuracy", 0.0)
        if not accuracy >= 0.85:
            print(f"train_ray.py: test accuracy {accuracy} is below 0.85", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
