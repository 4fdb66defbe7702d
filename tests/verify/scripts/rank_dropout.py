"""Two DDP ranks (gloo, torch.multiprocessing.spawn) whose model drops units: argv[1] `per-rank` seeds each rank
torch.manual_seed(SEED + rank), `alike` seeds every rank torch.manual_seed(SEED); rank 0 writes to argv[2] whether
the ranks' first dropout masks were the same (JSON)."""

import json
import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

SEED, RANKS = 5, 2


def train(rank: int, port: str, seeding: str, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group("gloo", rank=rank, world_size=RANKS)
    torch.manual_seed(SEED + rank if seeding == "per-rank" else SEED)
    model = torch.nn.Sequential(torch.nn.Linear(6, 64), torch.nn.Dropout(0.5), torch.nn.Linear(64, 1))
    masks = []
    model[1].register_forward_hook(lambda module, inputs, output: masks.append((output == 0).float()))
    model = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    inputs, targets = torch.ones(4, 6), torch.zeros(4, 1)
    for _ in range(2):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(inputs), targets).backward()
        optimizer.step()
    gathered = [torch.empty_like(masks[0]) for _ in range(RANKS)]
    dist.all_gather(gathered, masks[0].detach())
    if rank == 0:
        with open(out, "w") as file:
            json.dump({"same_masks": torch.equal(*gathered), "dropped": gathered[0].mean().item()}, file)
    dist.destroy_process_group()


if __name__ == "__main__":
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free_port = str(probe.getsockname()[1])
    mp.spawn(train, args=(free_port, sys.argv[1], sys.argv[2]), nprocs=RANKS)
