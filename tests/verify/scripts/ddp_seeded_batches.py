"""A torchrun-style DDP trainer without a DataLoader: each rank draws its batches by random index from one tensor,
its generator seeded with the seed plus its rank (the way character-level language model trainers shard their data).
`python -m torch.distributed.run --nproc-per-node 2 ddp_seeded_batches.py STEPS`.
"""

import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main(steps: int) -> None:
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    device = torch.device("cuda", local_rank)
    data = torch.randn(512, 8, generator=torch.Generator().manual_seed(0))
    seed_offset = rank  # every rank draws other batches
    torch.manual_seed(1337 + seed_offset)
    model = DistributedDataParallel(torch.nn.Linear(8, 1).to(device), device_ids=[local_rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        batch = data[torch.randint(len(data), (6,))].to(device)
        optimizer.zero_grad()
        loss = (model(batch) - batch.sum(dim=1, keepdim=True)).pow(2).mean()
        loss.backward()
        optimizer.step()
        if rank == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]))
