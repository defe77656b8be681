#!/usr/bin/env python3
"""PyTorch DDP (NCCL, world 1) on the same transformer shape as the `transformer_step` bench.

GPU check 5 of issue 14: run on the GPU machine next to
`transformer_step --backend cuda --collectives nccl` and compare the step times.

    python3 benches/pytorch/transformer_ddp.py [--steps 20] [--device cuda:0]
    python3 benches/pytorch/transformer_ddp.py --d-model 768 --layers 12 --heads 12 --seq-len 127

The shape flags are `transformer_step`'s (`--d-model --layers --heads --seq-len --batch`), with
the same defaults and checks.

The model mirrors the `transformer` example's TinyGpt: token and position embeddings
(vocabulary 12, by default 14 positions and width 256), by default 4 pre-norm encoder layers
(4 heads, feed-forward 4 x width with GELU as burn's default, no dropout) with a causal mask, a
final LayerNorm and a linear head; by default batches of 32 sequences of 13 tokens;
cross-entropy on the positions that hold the reversed digits (`scored_positions` in
ddp-examples); Adam with lr 0.002. As in the Rust bench, each step's batch is on the device before its timer starts,
plain steps and DDP steps are interleaved in rounds, each step ends with
torch.cuda.synchronize(), and times are medians.
"""

import argparse
import os
import statistics
import sys
import time

def shape_error(d_model: int, layers: int, heads: int, seq_len: int, batch: int):
    """What is wrong with a shape, as `transformer_step` says it; None when it can run."""
    if min(d_model, layers, heads, batch) < 1:
        return "--d-model, --layers, --heads and --batch must be at least 1"
    if d_model % heads:
        return f"--heads {heads} does not divide --d-model {d_model}"
    if seq_len < 3 or seq_len % 2 == 0:
        return f"--seq-len {seq_len} must be odd and at least 3 (2n + 1 tokens for n digits)"
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20, help="measured steps per configuration")
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--port", type=int, default=29533, help="rendezvous port on 127.0.0.1")
    parser.add_argument("--d-model", type=int, default=256, help="width of the residual stream")
    parser.add_argument("--layers", type=int, default=4, help="transformer layers")
    parser.add_argument("--heads", type=int, default=4, help="attention heads per layer")
    parser.add_argument("--seq-len", type=int, default=13, help="tokens per input sequence (odd)")
    parser.add_argument("--batch", type=int, default=32, help="sequences per step")
    args = parser.parse_args()
    error = shape_error(args.d_model, args.layers, args.heads, args.seq_len, args.batch)
    if error:
        parser.error(error)
    SEQ_LEN = (args.seq_len - 1) // 2  # digits reversed per sequence
    BATCH = args.batch
    D_MODEL, HEADS, LAYERS = args.d_model, args.heads, args.layers
    try:
        import torch
        import torch.distributed as dist
        from torch import nn
    except ImportError as e:
        print(f"transformer_ddp.py: PyTorch is not installed ({e}); run it where torch is", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("transformer_ddp.py: torch sees no CUDA device; this check needs a GPU", file=sys.stderr)
        return 2
    from tiny_gpt import VOCAB, TinyGpt, reversed_digits_batch

    device = torch.device(args.device)
    torch.cuda.set_device(device)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(args.port))
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=device)
    generator = torch.Generator().manual_seed(7)

    def batch():
        return reversed_digits_batch(BATCH, SEQ_LEN, generator, device)

    scored = slice(SEQ_LEN + 1, 2 * SEQ_LEN + 1)
    loss_fn = nn.CrossEntropyLoss()

    def step(model, opt, inputs, targets):
        logits = model(inputs)[:, scored]
        loss = loss_fn(logits.reshape(-1, VOCAB), targets[:, scored].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    torch.manual_seed(42)
    plain = TinyGpt(SEQ_LEN, D_MODEL, HEADS, LAYERS).to(device)
    ddp = nn.parallel.DistributedDataParallel(
        TinyGpt(SEQ_LEN, D_MODEL, HEADS, LAYERS).to(device), device_ids=[device.index]
    )
    plain_opt = torch.optim.Adam(plain.parameters(), lr=0.002)
    ddp_opt = torch.optim.Adam(ddp.parameters(), lr=0.002)
    params = sum(p.numel() for p in plain.parameters())
    times = {"plain": [], "ddp": []}
    rounds = 4
    per_round = -(-args.steps // rounds)
    for r in range(rounds + 1):
        for name, model, opt in (("plain", plain, plain_opt), ("ddp", ddp, ddp_opt)):
            for _ in range(per_round):
                inputs, targets = batch()
                torch.cuda.synchronize(device)
                t = time.perf_counter()
                step(model, opt, inputs, targets)
                torch.cuda.synchronize(device)
                if r > 0:
                    times[name].append(time.perf_counter() - t)
    p, d = statistics.median(times["plain"]), statistics.median(times["ddp"])
    print(f"# PyTorch {torch.__version__}, NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}, "
          f"{torch.cuda.get_device_name(device)}")
    print(f"# transformer step, world 1: d_model {D_MODEL}, {LAYERS} layers, {HEADS} heads, "
          f"{params / 1e6:.1f}M parameters, batch {BATCH} x {2 * SEQ_LEN + 1} tokens, Adam, "
          f"{rounds * per_round} steps per row (median)")
    print(f"  {'plain PyTorch':<28} {p * 1e3:>10.2f} ms/step")
    print(f"  {'DDP (NCCL, world 1)':<28} {d * 1e3:>10.2f} ms/step")
    print(f"  ratio DDP / plain: {d / p:.3f}")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
