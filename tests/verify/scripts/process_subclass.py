"""A DDP trainer whose ranks are multiprocessing.Process subclasses that override run() (the classic
`class Worker(mp.Process)` pattern), one cuda device each, started with the method in argv[1] (spawn by default);
`no-ddp` in argv trains each rank's model on its own, never all-reducing its gradients."""

import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

RANKS = 2


class Worker(mp.Process):
    def __init__(self, rank: int, port: str) -> None:
        super().__init__()
        self.rank, self.port = rank, port

    def run(self) -> None:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=self.port)
        dist.init_process_group("gloo", rank=self.rank, world_size=RANKS)
        torch.cuda.set_device(self.rank)
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).to(self.rank)
        if "no-ddp" not in sys.argv:
            model = DistributedDataParallel(model, device_ids=[self.rank])
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        generator = torch.Generator().manual_seed(self.rank)
        for _ in range(3):
            optimizer.zero_grad()
            inputs, targets = torch.randn(4, 6, generator=generator), torch.randn(4, 1, generator=generator)
            torch.nn.functional.mse_loss(model(inputs.to(self.rank)), targets.to(self.rank)).backward()
            optimizer.step()
        dist.destroy_process_group()


if __name__ == "__main__":
    mp.set_start_method(sys.argv[1] if len(sys.argv) > 1 and sys.argv[1] != "no-ddp" else "spawn")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free_port = str(probe.getsockname()[1])
    workers = [Worker(rank, free_port) for rank in range(RANKS)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
