"""A small MLP trained with PyTorch DDP and a DistributedSampler.

    torchrun --nproc-per-node 2 docs/guide/pytorch/mlp_ddp.py

The guide's "Coming from PyTorch" page ports this script to ddp-burn line by line:
ddp-examples/src/bin/from_pytorch.rs.
"""
import math

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler

EPOCHS, BATCH, LR, SEED = 8, 32, 0.01, 42


class Rings(Dataset):
    """2,048 points in the square [-1, 1]^2; label 1 inside the circle of radius 0.7."""

    def __len__(self):
        return 2048

    def __getitem__(self, i):
        x = [math.sin(i * 12.9898) * 0.5 + math.sin(i * 0.731) * 0.5,
             math.cos(i * 78.233) * 0.5 + math.cos(i * 0.317) * 0.5]
        label = 1 if x[0] ** 2 + x[1] ** 2 < 0.49 else 0
        return torch.tensor(x, dtype=torch.float32), label


def main():
    dist.init_process_group("gloo")  # RANK, WORLD_SIZE, MASTER_ADDR, ... from torchrun
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(SEED)
    model = DDP(nn.Sequential(nn.Linear(2, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                              nn.Linear(64, 2)))  # rank 0's weights are broadcast
    data = Rings()
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=SEED)
    loader = DataLoader(data, batch_size=BATCH, sampler=sampler)
    optim = torch.optim.Adam(model.parameters(), lr=LR)
    loss_fn = nn.CrossEntropyLoss()
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)  # a new shuffle every epoch, the same on every rank
        for x, y in loader:
            optim.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()  # gradients are averaged over the ranks here
            optim.step()
        if rank == 0:
            print(f"epoch {epoch}: last batch loss {loss.item():.4f}")
    # Accuracy over the whole set: each rank scores every world-th sample, then the counts
    # are summed over the ranks.
    correct = count = 0
    with torch.no_grad():
        for i in range(rank, len(data), world):
            x, y = data[i]
            correct += int(model(x.unsqueeze(0)).argmax(1).item() == y)
            count += 1
    totals = torch.tensor([correct, count], dtype=torch.float64)
    dist.all_reduce(totals)
    if rank == 0:
        print(f"accuracy {100 * totals[0] / totals[1]:.2f}% of {int(totals[1])} points")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
