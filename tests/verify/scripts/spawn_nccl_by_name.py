"""A GPU script in the style of pytorch/examples' DDP tutorial: init_process_group and destroy_process_group imported
by name, nccl on the rank's CUDA device, torch.multiprocessing.spawn over every device torch.cuda finds. Its spawned
ranks import it before they run: on the emulated CUDA, the names it imported must be the emulation's."""

import os
import socket

import torch
import torch.multiprocessing as mp
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel


def train(rank: int, world_size: int, port: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    torch.cuda.set_device(rank)
    init_process_group(backend="nccl", rank=rank, world_size=world_size)
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(5, 1).to(rank), device_ids=[rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(rank)
    for _ in range(3):
        optimizer.zero_grad()
        inputs, targets = torch.randn(4, 5, generator=generator), torch.randn(4, 1, generator=generator)
        torch.nn.functional.mse_loss(model(inputs.to(rank)), targets.to(rank)).backward()
        optimizer.step()
    destroy_process_group()


if __name__ == "__main__":
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free_port = str(probe.getsockname()[1])
    devices = torch.cuda.device_count()
    mp.spawn(train, args=(devices, free_port), nprocs=devices)
