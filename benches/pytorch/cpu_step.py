"""PyTorch's side of the cpu_step bench: the same models, batches and SGD step on the CPU.

Run by `cargo bench -p ddp-benches --bench cpu_step -- --python PYTHON`; prints
`RESULT <median ms per step> <minor page faults per step>` like the bench's own rows.
"""

import argparse
import resource
import statistics
import time

import torch
from torch import nn


def mlp():
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(784, 4096),
        nn.ReLU(),
        nn.Linear(4096, 4096),
        nn.ReLU(),
        nn.Linear(4096, 10),
    )


def cnn():
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2, 2),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2, 2),
        nn.Flatten(),
        nn.Linear(64 * 7 * 7, 10),
    )


def conv2_weight_grad(args):
    """The backward of the CNN's second convolution alone (input without a gradient)."""
    conv = nn.Conv2d(32, 64, 3, padding=1)
    times, faults = [], 0
    for step in range(args.warmup + args.steps):
        out = conv(torch.rand(16, 32, 14, 14)).sum()
        t, f = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        out.backward()
        if step >= args.warmup:
            times.append((time.perf_counter() - t) * 1e3)
            faults += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f
        conv.zero_grad(set_to_none=True)
    print(f"RESULT {statistics.median(times):.3f} {faults / args.steps:.0f}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=["mlp", "cnn", "conv2-wgrad"], required=True)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()

    torch.manual_seed(7)
    torch.set_num_threads(args.threads)
    if args.model == "conv2-wgrad":
        return conv2_weight_grad(args)
    model, batch = (mlp(), 32) if args.model == "mlp" else (cnn(), 16)
    optim = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    y = torch.arange(batch) % 10
    times, faults = [], 0
    for step in range(args.warmup + args.steps):
        x = torch.rand(batch, 1, 28, 28)
        t, f = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        optim.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        optim.step()
        if step >= args.warmup:
            times.append((time.perf_counter() - t) * 1e3)
            faults += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f
    print(f"RESULT {statistics.median(times):.3f} {faults / args.steps:.0f}")


if __name__ == "__main__":
    main()
