"""One plain PyTorch process training what train/examples/fashion_mnist.rs
trains: the same file (scripts/fetch-dataset.sh), the same split (every 7th
image of each class held out), the same MLP or CNN, Adam 1e-3, cross-entropy,
a global batch of 128 (Prism's 2 workers take 64 each), the whole dataset on
the device and batches gathered there, the loss read once per epoch.

    python3 fashion_mnist_torch.py --data fashion-mnist.bin [--model mlp|cnn] [--epochs 4]

Prints each epoch's training time (synchronised with the device) and the
test accuracy, then one summary line in the format of the Prism example's.
"""

import argparse
import statistics
import struct
import time

import torch
import torch.nn as nn


def load(path):
    raw = open(path, "rb").read()
    if raw[:8] != b"PRISMDS1":
        raise SystemExit(f"{path} is not a dataset written by scripts/fetch-dataset.sh")
    n, rows, cols = struct.unpack("<III", raw[8:20])
    peak = raw[20]
    labels = torch.frombuffer(bytearray(raw[21 : 21 + n]), dtype=torch.uint8).long()
    pixels = torch.frombuffer(bytearray(raw[21 + n :]), dtype=torch.uint8).view(n, rows * cols)
    train, test, seen = [], [], [0] * 10
    for i, label in enumerate(labels.tolist()):
        (test if seen[label % 10] % 7 == 6 else train).append(i)
        seen[label % 10] += 1
    return pixels, labels, float(peak), torch.tensor(train), torch.tensor(test)


def model(arch):
    if arch == "mlp":
        return nn.Sequential(
            nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10)
        )
    return nn.Sequential(
        nn.Unflatten(1, (1, 28, 28)),
        nn.Conv2d(1, 32, 3), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 5 * 5, 128), nn.ReLU(), nn.Linear(128, 10),
    )


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--model", default="mlp", choices=["mlp", "cnn"])
    p.add_argument("--epochs", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = p.parse_args()
    epochs = a.epochs or (4 if a.model == "mlp" else 6)
    torch.manual_seed(7)
    dev = torch.device(a.device)
    pixels, labels, peak, train, test = load(a.data)
    pixels, labels, train, test = pixels.to(dev), labels.to(dev), train.to(dev), test.to(dev)
    net = model(a.model).to(dev)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    times = []
    for epoch in range(epochs):
        if dev.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        order = train[torch.randperm(len(train), device=dev)]
        loss_sum = torch.zeros((), device=dev)
        steps = 0
        for i in range(0, len(order), a.batch_size):
            idx = order[i : i + a.batch_size]
            x = pixels.index_select(0, idx).float() / peak
            y = labels.index_select(0, idx)
            loss = loss_fn(net(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            loss_sum += loss.detach()
            steps += 1
        mean_loss = loss_sum.item() / steps
        times.append(time.perf_counter() - start)
        correct = 0
        with torch.no_grad():
            for i in range(0, len(test), 1000):
                idx = test[i : i + 1000]
                x = pixels.index_select(0, idx).float() / peak
                correct += (net(x).argmax(-1) == labels.index_select(0, idx)).sum().item()
        accuracy = correct / len(test)
        print(f"epoch {epoch}: {times[-1]:.2f} s, loss {mean_loss:.4f}, test accuracy {accuracy:.4f}", flush=True)
    print(
        f"torch-1proc fashion-mnist {a.model} workers=1 gpu={dev.type == 'cuda'} epochs={epochs} "
        f"median_epoch_s={statistics.median(times):.3f} accuracy={accuracy:.4f}",
        flush=True,
    )


if __name__ == "__main__":
    main()
