#!/usr/bin/env python3
"""PyTorch DDP (gloo, CPU, world 2) on the transformer shape of the `ddp_step` overlap table.

    python3 benches/pytorch/ddp_overlap.py [--steps 12] [--threads 1]

Issue 30's side-by-side: the share of all-reduce time PyTorch DDP hides behind backward, and
its step time, on the model of the `transformer` example (TinyGpt: token and position
embeddings, vocabulary 12, width 256, 4 pre-norm encoder layers with 4 heads, feed-forward
1024, GELU, causal mask, a final LayerNorm and a linear head), batch 32 sequences of 13
tokens per rank, cross-entropy on the 6 reversed-digit positions, SGD (lr 0.01), buckets of
a quarter of the gradient bytes (3.0 MiB) after PyTorch's fixed 1 MiB first bucket: what
ddp-core's default gives this model (`DdpConfig::min_buckets` = 4; PyTorch's 25 MiB alone would
make its 12.7 MB of gradients two buckets). Two processes on 127.0.0.1, one compute thread
each unless `--threads`. `cargo bench -p ddp-benches --bench ddp_step -- --overlap-only --python
PYTHON` prints its figures under the bench's own transformer rows.

Overlap is measured as the Rust bench measures it: a communication hook wraps gloo's
all-reduce and records when each bucket's all-reduce started and finished; a gradient hook on
the two embedding tables (the last gradients backward computes) records when backward's
computation ended; the hidden share is the part of every bucket's all-reduce interval that lies
before that point, over the sum of the intervals. Step time covers forward, backward (which in
PyTorch returns only when every bucket is reduced) and the optimizer step; medians over the
measured steps after 2 warm-up steps. Rank 0 prints one line: `RESULT <step ms> <hidden %>`
after a human-readable table.
"""

import argparse
import os
import statistics
import sys
import time

SEQ_LEN = 6
BATCH = 32
VOCAB = 12
BOS, SEP = 10, 11
D_MODEL, HEADS, LAYERS = 256, 4, 4
WARMUP = 2


def worker(rank: int, args) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn

    torch.set_num_threads(args.threads)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(args.port)
    dist.init_process_group("gloo", rank=rank, world_size=2)

    class TinyGpt(nn.Module):
        def __init__(self):
            super().__init__()
            self.token = nn.Embedding(VOCAB, D_MODEL)
            self.position = nn.Embedding(2 * SEQ_LEN + 2, D_MODEL)
            self.layers = nn.ModuleList(
                nn.TransformerEncoderLayer(
                    D_MODEL,
                    HEADS,
                    4 * D_MODEL,
                    dropout=0.0,
                    activation="gelu",
                    norm_first=True,
                    batch_first=True,
                )
                for _ in range(LAYERS)
            )
            self.norm = nn.LayerNorm(D_MODEL)
            self.head = nn.Linear(D_MODEL, VOCAB)

        def forward(self, tokens):
            seq = tokens.shape[1]
            positions = torch.arange(seq).unsqueeze(0)
            x = self.token(tokens) + self.position(positions)
            mask = nn.Transformer.generate_square_subsequent_mask(seq)
            for layer in self.layers:
                x = layer(x, src_mask=mask, is_causal=True)
            return self.head(self.norm(x))

    torch.manual_seed(42)
    model = TinyGpt()
    # ddp-core's default for this model: the 25 MiB cap lowered to a quarter of the gradients.
    grad_mib = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=min(25.0, grad_mib / 4))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(7 + rank)

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

    model.token.weight.register_hook(mark_compute_end)
    model.position.weight.register_hook(mark_compute_end)

    scored = slice(SEQ_LEN + 1, 2 * SEQ_LEN + 1)
    loss_fn = nn.CrossEntropyLoss()

    def batch():
        digits = torch.randint(0, 10, (BATCH, SEQ_LEN), generator=generator)
        bos = torch.full((BATCH, 1), BOS)
        sep = torch.full((BATCH, 1), SEP)
        seqs = torch.cat([bos, digits, sep, digits.flip(1)], dim=1)
        return seqs[:, :-1], seqs[:, 1:]

    steps, hidden = [], []
    for step in range(WARMUP + args.steps):
        inputs, targets = batch()
        intervals.clear()
        compute_end[0] = 0.0
        t = time.perf_counter()
        logits = ddp(inputs)[:, scored]
        loss = loss_fn(logits.reshape(-1, VOCAB), targets[:, scored].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        elapsed = time.perf_counter() - t
        if step < WARMUP:
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
        print(f"# transformer: {params / 1e6:.1f}M parameters, batch {BATCH} x "
              f"{2 * SEQ_LEN + 1} tokens per rank, SGD, {args.steps} steps (median), "
              f"{len(intervals)} buckets")
        print(f"  step {step_ms:.2f} ms, all-reduce hidden behind backward {hidden_pct:.0f}%")
        print(f"RESULT {step_ms:.3f} {hidden_pct:.1f}")
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=12, help="measured steps (after 2 warm-up)")
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
