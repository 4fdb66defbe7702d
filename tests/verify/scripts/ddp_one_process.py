"""DistributedDataParallel with one process on gloo."""

import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
dist.init_process_group("gloo", rank=0, world_size=1)
model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
try:
    for _ in range(10):
        loss = torch.nn.functional.cross_entropy(model(torch.randn(8, 4)), torch.randint(0, 2, (8,)))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
finally:
    dist.destroy_process_group()
