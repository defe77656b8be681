#!/usr/bin/env python3
"""PyTorch DDP (gloo, CPU, world 2) on the models of the `ddp_step` benches.

    python3 benches/pytorch/ddp_overlap.py [--model transformer|mlp|cnn|cnn28] [--steps 12] [--threads 1]

The models are those of `ddp_benches::workloads`, built the same way in PyTorch:
- transformer (default): the `transformer` example's TinyGpt (token and position embeddings,
  vocabulary 12, width 256, 4 pre-norm encoder layers with 4 heads, feed-forward 1024, GELU,
  causal mask, a final LayerNorm and a linear head), batch 32 sequences of 13 tokens per rank,
  cross-entropy on the 6 reversed-digit positions;
- mlp: Linear 1024-2048-2048-10 with ReLU, batch 64 of normal inputs;
- cnn: the `digits_cnn` example's model (conv 3x3 1->32, BatchNorm, ReLU, conv 3x3 32->64,
  BatchNorm, ReLU, 2x2 average pool, linear 1024->10) on 64 normal 8x8 images. PyTorch's
  SyncBatchNorm does not run on CPUs, so both sides use each rank's own batch statistics
  (DDP broadcasts rank 0's running statistics, as ours does);
- cnn28: a user's CNN on 28x28 images (conv 3x3 1->32, ReLU, conv 3x3 32->64, ReLU, linear
  50176->10; 0.5M parameters), batch 32 of normal images.
SGD (lr 0.01), buckets of a quarter of the gradient bytes after PyTorch's fixed 1 MiB first
bucket: what ddp-core's default gives these models (`DdpConfig::min_buckets` = 4). Two
processes on 127.0.0.1, one compute thread each unless `--threads`.
`cargo bench -p ddp-benches --bench ddp_step -- --overlap-only --python PYTHON` prints the
transformer's figures under the bench's own rows; `ddp_vs_pytorch` runs every model.

Overlap is measured as the Rust bench measures it: a communication hook wraps gloo's
all-reduce and records when each bucket's all-reduce started and finished; a gradient hook on
the first layer's parameters (the last gradients backward computes) records when backward's
computation ended; the hidden share is the part of every bucket's all-reduce interval that lies
before that point, over the sum of the intervals. Step time covers forward, backward (which in
PyTorch returns only when every bucket is reduced) and the optimizer step; medians over the
measured steps after the warm-up steps. Rank 0 prints one line: `RESULT <step ms> <hidden %>`
after a human-readable table.
"""

import argparse
import os
import statistics
import sys
import time

SEQ_LEN = 6
BATCH = 32
D_MODEL, HEADS, LAYERS = 256, 4, 4
MLP_BATCH, CNN_BATCH, CNN_CHANNELS = 64, 64, 32


def worker(rank: int, args) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from tiny_gpt import VOCAB, TinyGpt, reversed_digits_batch

    torch.set_num_threads(args.threads)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(args.port)
    dist.init_process_group("gloo", rank=rank, world_size=2)

    class Mlp(nn.Module):
        def __init__(self):
            super().__init__()
            self.l1 = nn.Linear(1024, 2048)
            self.l2 = nn.Linear(2048, 2048)
            self.l3 = nn.Linear(2048, 10)

        def forward(self, x):
            return self.l3(torch.relu(self.l2(torch.relu(self.l1(x)))))

    class DigitsCnn(nn.Module):
        def __init__(self):
            super().__init__()
            c = CNN_CHANNELS
            self.conv1 = nn.Conv2d(1, c, 3, padding=1)
            self.norm1 = nn.BatchNorm2d(c)
            self.conv2 = nn.Conv2d(c, 2 * c, 3, padding=1)
            self.norm2 = nn.BatchNorm2d(2 * c)
            self.pool = nn.AvgPool2d(2, stride=2)
            self.out = nn.Linear(2 * c * 16, 10)

        def forward(self, images):
            x = images.reshape(-1, 1, 8, 8)
            x = torch.relu(self.norm1(self.conv1(x)))
            x = torch.relu(self.norm2(self.conv2(x)))
            return self.out(self.pool(x).flatten(1))

    class UserCnn(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
            self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
            self.out = nn.Linear(64 * 28 * 28, 10)

        def forward(self, images):
            x = torch.relu(self.conv2(torch.relu(self.conv1(images))))
            return self.out(x.flatten(1))

    torch.manual_seed(42)
    generator = torch.Generator().manual_seed(7 + rank)
    loss_fn = nn.CrossEntropyLoss()
    scored = slice(SEQ_LEN + 1, 2 * SEQ_LEN + 1)

    if args.model == "transformer":
        model = TinyGpt(SEQ_LEN, D_MODEL, HEADS, LAYERS)
        first = [model.token.weight, model.position.weight]
        batch_desc = f"batch {BATCH} x {2 * SEQ_LEN + 1} tokens"

        def batch():
            return reversed_digits_batch(BATCH, SEQ_LEN, generator)

        def loss_of(out, targets):
            return loss_fn(out[:, scored].reshape(-1, VOCAB), targets[:, scored].reshape(-1))
    else:
        model, n, shape, first_layer = {
            "mlp": lambda m: (m, MLP_BATCH, (1024,), m.l1),
            "cnn": lambda m: (m, CNN_BATCH, (64,), m.conv1),
            "cnn28": lambda m: (m, 32, (1, 28, 28), m.conv1),
        }[args.model]({"mlp": Mlp, "cnn": DigitsCnn, "cnn28": UserCnn}[args.model]())
        first = list(first_layer.parameters())
        batch_desc = f"batch {n}"
        labels = torch.arange(n) % 10

        def batch():
            return torch.randn(n, *shape, generator=generator), labels

        def loss_of(out, targets):
            return loss_fn(out, targets)

    # ddp-core's default for this model: the 25 MiB cap lowered to a quarter of the gradients.
    grad_mib = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=min(25.0, grad_mib / 4))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)

    # Per step: [start, end] of each bucket's all-reduce, and when backward's compute ended.
    intervals = []
    compute_end = [0.0]

    def timed_allreduce(_state, bucket):
        start = time.perf_counter()
        tensor = bucket.buffer()
        fut = dist.all_reduce(tensor, async_op=True).get_future()
        slot = [start, None]
        intervals.append(slot)

        def done(f):
            slot[1] = time.perf_counter()
            return f.value()[0].div_(2)

        return fut.then(done)

    ddp.register_comm_hook(None, timed_allreduce)

    def mark_compute_end(grad):
        compute_end[0] = max(compute_end[0], time.perf_counter())
        return grad

    for p in first:
        p.register_hook(mark_compute_end)

    steps, hidden = [], []
    for step in range(args.warmup + args.steps):
        inputs, targets = batch()
        intervals.clear()
        compute_end[0] = 0.0
        t = time.perf_counter()
        loss = loss_of(ddp(inputs), targets)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        elapsed = time.perf_counter() - t
        if step < args.warmup:
            continue
        steps.append(elapsed)
        total = sum(end - start for start, end in intervals)
        before = sum(max(0.0, min(end, compute_end[0]) - start) for start, end in intervals)
        hidden.append(before / total if total > 0 else 0.0)
    if rank == 0:
        params = sum(p.numel() for p in model.parameters())
        step_ms = statistics.median(steps) * 1e3
        hidden_pct = statistics.median(hidden) * 100
        print(f"# PyTorch {torch.__version__} DDP (gloo), world 2 on 127.0.0.1, "
              f"{args.threads} thread(s) per rank")
        print(f"# {args.model}: {params / 1e6:.2f}M parameters, {batch_desc} per rank, SGD, "
              f"{args.steps} steps (median), {len(intervals)} buckets")
        print(f"  step {step_ms:.2f} ms, all-reduce hidden behind backward {hidden_pct:.0f}%")
        print(f"RESULT {step_ms:.3f} {hidden_pct:.1f}")
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=["transformer", "mlp", "cnn", "cnn28"], default="transformer")
    parser.add_argument("--steps", type=int, default=12, help="measured steps (after the warm-up)")
    parser.add_argument("--warmup", type=int, default=2, help="warm-up steps (not measured)")
    parser.add_argument("--threads", type=int, default=1, help="compute threads per rank")
    parser.add_argument("--port", type=int, default=29534, help="rendezvous port on 127.0.0.1")
    args = parser.parse_args()
    try:
        import torch.multiprocessing as mp
    except ImportError as e:
        print(f"ddp_overlap.py: PyTorch is not installed ({e}); run it with a Python that has torch",
              file=sys.stderr)
        return 2
    mp.spawn(worker, args=(args,), nprocs=2, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
