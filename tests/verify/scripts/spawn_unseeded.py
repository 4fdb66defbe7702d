"""A DDP trainer that spawns its 2 ranks and seeds nothing (as pytorch/examples' ddp main.py): each rank draws its own
initial model, which DDP replaces by rank 0's, and its own data. argv[1] "no-ddp": the model is not wrapped."""

import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel


def train(rank: int, port: str, wrap: bool) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    model = torch.nn.Linear(6, 1)
    model = DistributedDataParallel(model) if wrap else model
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for _ in range(2):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(torch.randn(4, 6)), torch.randn(4, 1)).backward()
        optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free_port = str(probe.getsockname()[1])
    mp.spawn(train, args=(free_port, sys.argv[1:] != ["no-ddp"]), nprocs=2)
