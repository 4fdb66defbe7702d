"""A DDP trainer that starts its own ranks with torch.multiprocessing.spawn (no launcher): each rank sets the
process group up from the address it is given, shards a seeded dataset with a DistributedSampler and trains."""

import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

WORLD_SIZE = 2


def train(rank: int, world_size: int, port: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(),
                                                        torch.nn.Linear(16, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    generator = torch.Generator().manual_seed(0)
    dataset = TensorDataset(torch.randn(32, 6, generator=generator), torch.randn(32, 1, generator=generator))
    sampler = DistributedSampler(dataset)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        for inputs, targets in DataLoader(dataset, batch_size=4, sampler=sampler):
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(inputs), targets).backward()
            optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free_port = str(probe.getsockname()[1])
    mp.spawn(train, args=(WORLD_SIZE, free_port), nprocs=WORLD_SIZE)
