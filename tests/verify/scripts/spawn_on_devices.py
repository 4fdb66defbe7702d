"""A DDP trainer that wants one GPU a rank and starts its ranks itself: it checks torch.cuda.device_count(), puts
each rank's model on cuda:RANK, spawns its ranks, then spawns them again for a second demo (verify keeps the first)."""

import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

RANKS = 2


def train(rank: int, world_size: int, port: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    torch.cuda.set_device(rank)
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(6, 1).to(rank), device_ids=[rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    generator = torch.Generator().manual_seed(rank)
    for _ in range(3):
        optimizer.zero_grad()
        inputs, targets = torch.randn(4, 6, generator=generator), torch.randn(4, 1, generator=generator)
        torch.nn.functional.mse_loss(model(inputs.to(rank)), targets.to(f"cuda:{rank}")).backward()
        optimizer.step()
    dist.destroy_process_group()


def free_port() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return str(probe.getsockname()[1])


if __name__ == "__main__":
    gpus = torch.cuda.device_count()
    if gpus < RANKS:
        print(f"Requires at least {RANKS} GPUs to run, but got {gpus}.")
        sys.exit()
    for demo in range(2):
        mp.spawn(train, args=(RANKS, free_port()), nprocs=RANKS)
