"""Ray Tune's side of bench/ray/tune_compare.sh: the search of
tune/examples/tune_fashion_mnist.rs with Ray Tune 2.60 and PyTorch.

Same data (the file scripts/fetch-dataset.sh writes, split the same way:
every 7th image of each class held out), same model (784 -> hidden -> 10,
ReLU, Adam, cross-entropy, one thread per trial), same search space
(lr log-uniform 1e-4..1e-2, hidden a choice of 64/128/256, batch size a grid
of 64 and 128, 4 samples: 8 trials), same scheduler (ASHA, max_t = epochs,
grace period 1, reduction factor 2), one CPU per trial, a checkpoint every
epoch. The seed is the same number; the two libraries draw different
configs from it.

    "$HOME/.cache/prism/ray-train-2.60.0/bin/python" bench/ray/tune_ray.py [--epochs 4] [--samples 4] [--data FILE]

Prints one line for the comparison script:
    ray-tune fashion_mnist trials=8 wall_s=... best_accuracy=...
"""
import argparse
import os
import struct
import tempfile
import time

import numpy as np
import torch
from torch import nn

import ray
from ray import tune
from ray.tune import Checkpoint
from ray.tune.schedulers import ASHAScheduler
from ray.tune.search.basic_variant import BasicVariantGenerator


def load(path):
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:8] != b"PRISMDS1":
        raise SystemExit(f"{path} is not a dataset written by scripts/fetch-dataset.sh")
    (n,) = struct.unpack("<I", raw[8:12])
    peak = float(raw[20])
    labels = np.frombuffer(raw, dtype=np.uint8, count=n, offset=21)
    pixels = np.frombuffer(raw, dtype=np.uint8, offset=21 + n).reshape(n, 784)
    seen = [0] * 10
    train, test = [], []
    for i, label in enumerate(labels):
        k = seen[label % 10]
        (test if k % 7 == 6 else train).append(i)
        seen[label % 10] += 1
    return pixels, labels, peak, np.array(train), np.array(test)


def trial(config):
    torch.set_num_threads(1)
    torch.manual_seed(config["seed"])
    pixels, labels, peak, train, test = load(config["data"])
    x_all = torch.from_numpy(pixels.copy())
    y_all = torch.from_numpy(labels.astype(np.int64))
    model = nn.Sequential(nn.Linear(784, config["hidden"]), nn.ReLU(), nn.Linear(config["hidden"], 10))
    opt = torch.optim.Adam(model.parameters(), lr=config["lr"])
    loss_fn = nn.CrossEntropyLoss()
    start = 0
    checkpoint = tune.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as d:
            state = torch.load(os.path.join(d, "model.pt"))
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["opt"])
            start = state["epoch"] + 1
    bs = config["batch_size"]
    for epoch in range(start, config["epochs"]):
        g = torch.Generator().manual_seed(config["seed"] + epoch)
        order = torch.from_numpy(train)[torch.randperm(len(train), generator=g)]
        loss_sum, steps = 0.0, 0
        for i in range(0, len(order), bs):
            idx = order[i:i + bs]
            x = x_all[idx].float() / peak
            loss = loss_fn(model(x), y_all[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            loss_sum += loss.item()
            steps += 1
        with torch.no_grad():
            correct = 0
            for i in range(0, len(test), 1000):
                idx = torch.from_numpy(test[i:i + 1000])
                correct += (model(x_all[idx].float() / peak).argmax(-1) == y_all[idx]).sum().item()
        with tempfile.TemporaryDirectory() as d:
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "epoch": epoch},
                       os.path.join(d, "model.pt"))
            tune.report({"epoch": epoch, "loss": loss_sum / max(steps, 1),
                         "val_accuracy": correct / len(test)},
                        checkpoint=Checkpoint.from_directory(d))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--data", default=os.path.join(os.environ.get("HOME", ""), ".cache/prism/datasets/fashion-mnist.bin"))
    args = p.parse_args()
    load(args.data)  # fail here, not in every trial
    started = time.monotonic()
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    space = {
        "lr": tune.loguniform(1e-4, 1e-2),
        "hidden": tune.choice([64, 128, 256]),
        "batch_size": tune.grid_search([64, 128]),
        "epochs": args.epochs,
        "seed": 7,
        "data": os.path.abspath(args.data),
    }
    tuner = tune.Tuner(
        tune.with_resources(trial, {"cpu": 1}),
        param_space=space,
        tune_config=tune.TuneConfig(
            metric="val_accuracy",
            mode="max",
            num_samples=args.samples,
            scheduler=ASHAScheduler(max_t=args.epochs, grace_period=1, reduction_factor=2),
            search_alg=BasicVariantGenerator(random_state=7),
        ),
        run_config=tune.RunConfig(
            name=f"tune_fashion_mnist_{os.getpid()}",
            storage_path=os.path.join(tempfile.gettempdir(), "ray_results"),
            verbose=0,
        ),
    )
    results = tuner.fit()
    best = results.get_best_result()
    wall = time.monotonic() - started
    accuracy = best.metrics["val_accuracy"]
    print(f"best: {best.config['lr']:.2e} hidden {best.config['hidden']} batch {best.config['batch_size']}"
          f" -> val_accuracy {accuracy:.4f}")
    print(f"ray-tune fashion_mnist trials={len(results)} wall_s={wall:.2f} best_accuracy={accuracy:.4f}")
    ray.shutdown()


if __name__ == "__main__":
    main()
