"""One plain PyTorch process training what train/examples/fashion_mnist.rs
trains: the same file (scripts/fetch-dataset.sh), the same split (every 7th
image of each class held out), the same MLP, CNN or small Vision Transformer
(the ViT written here in plain torch, layer for layer and initialised as the
tch one is; torchvision is not needed), Adam, cross-entropy, a global
batch of 128 (Prism's 2 workers take 64 each), the whole dataset on the
device and batches gathered there, the loss read once per epoch.

The MLP and the CNN train at a constant learning rate of 1e-3. The ViT
(4x4 patches: 49 plus the class token, width 64, 4 pre-norm blocks of 4
heads, MLP 128) follows vit_lr, set before every step: a linear warm-up
from 0 to 2e-3 over the first epoch, then a cosine down to 0 at the end of
the last, with the progress counted in images as the Prism example does.

    python3 fashion_mnist_torch.py --data fashion-mnist.bin [--model mlp|cnn|vit] [--epochs 4]

Default epochs: 4 (mlp), 6 (cnn), 15 (vit), as in the Prism example.

Prints each epoch's training time (synchronised with the device) and the
test accuracy, then one summary line in the format of the Prism example's.
"""

import argparse
import math
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


# The ViT's sizes, as in fashion_mnist.rs: 4x4 patches (49, plus the class
# token: 50 positions), width 64, 4 pre-norm blocks, 4 heads, MLP 128.
PATCH, WIDTH, DEPTH, HEADS, MLP_WIDTH = 4, 64, 4, 4, 128
TOKENS = (28 // PATCH) ** 2 + 1


def vit_lr(peak, epochs, progress):
    """The ViT's learning rate at `progress` epochs into a run of `epochs`,
    as vit_lr in fashion_mnist.rs: linear from 0 to `peak` over the first
    epoch, then a cosine down to 0 at the end of the last."""
    if progress < 1.0:
        return peak * progress
    decay = float(max(epochs, 2) - 1)
    done = min((progress - 1.0) / decay, 1.0)
    return peak * 0.5 * (1.0 + math.cos(math.pi * done))


def tch_linear(inputs, outputs):
    """nn.Linear initialised as tch's default: Kaiming-uniform (ReLU gain)
    weights, biases uniform within 1/sqrt(fan_in) (torch's default)."""
    layer = nn.Linear(inputs, outputs)
    nn.init.kaiming_uniform_(layer.weight, nonlinearity="relu")
    return layer


class Block(nn.Module):
    """x + attention(norm(x)), then x + mlp(norm(x))."""

    def __init__(self):
        super().__init__()
        self.norm1 = nn.LayerNorm(WIDTH)
        self.qkv = tch_linear(WIDTH, 3 * WIDTH)
        self.proj = tch_linear(WIDTH, WIDTH)
        self.norm2 = nn.LayerNorm(WIDTH)
        self.fc1 = tch_linear(WIDTH, MLP_WIDTH)
        self.fc2 = tch_linear(MLP_WIDTH, WIDTH)

    def attention(self, x):
        batch, tokens, _ = x.shape
        head_width = WIDTH // HEADS
        qkv = self.qkv(x).view(batch, tokens, 3, HEADS, head_width).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        weights = (q @ k.transpose(-2, -1) / head_width**0.5).softmax(-1)
        return self.proj((weights @ v).transpose(1, 2).reshape(batch, tokens, WIDTH))

    def forward(self, x):
        x = x + self.attention(self.norm1(x))
        return x + self.fc2(nn.functional.gelu(self.fc1(self.norm2(x))))


class Vit(nn.Module):
    """Patches embedded by a strided convolution, a class token in front,
    learned positions, the blocks, a linear head on the class token."""

    def __init__(self):
        super().__init__()
        self.patches = nn.Conv2d(1, WIDTH, PATCH, stride=PATCH)
        nn.init.kaiming_uniform_(self.patches.weight, nonlinearity="relu")
        nn.init.zeros_(self.patches.bias)
        self.class_token = nn.Parameter(torch.randn(1, 1, WIDTH) * 0.02)
        self.positions = nn.Parameter(torch.randn(1, TOKENS, WIDTH) * 0.02)
        self.blocks = nn.Sequential(*[Block() for _ in range(DEPTH)])
        self.norm = nn.LayerNorm(WIDTH)
        self.head = tch_linear(WIDTH, 10)

    def forward(self, x):
        patches = self.patches(x.view(-1, 1, 28, 28)).flatten(2).transpose(1, 2)
        class_token = self.class_token.expand(patches.shape[0], 1, WIDTH)
        tokens = torch.cat([class_token, patches], 1) + self.positions
        return self.head(self.norm(self.blocks(tokens)[:, 0]))


def model(arch):
    if arch == "vit":
        return Vit()
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
    p.add_argument("--model", default="mlp", choices=["mlp", "cnn", "vit"])
    p.add_argument("--epochs", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = p.parse_args()
    epochs = a.epochs or {"mlp": 4, "cnn": 6, "vit": 15}[a.model]
    torch.manual_seed(7)
    dev = torch.device(a.device)
    pixels, labels, peak, train, test = load(a.data)
    pixels, labels, train, test = pixels.to(dev), labels.to(dev), train.to(dev), test.to(dev)
    net = model(a.model).to(dev)
    peak_lr = 2e-3 if a.model == "vit" else 1e-3
    opt = torch.optim.Adam(net.parameters(), lr=peak_lr)
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
            if a.model == "vit":
                # Progress in images, counted as the Prism example counts it.
                images = float(steps + 1) * float(a.batch_size)
                lr = vit_lr(peak_lr, epochs, float(epoch) + images / float(len(train)))
                for group in opt.param_groups:
                    group["lr"] = lr
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
