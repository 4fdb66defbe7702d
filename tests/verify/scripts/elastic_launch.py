"""A DDP trainer that starts its ranks with torch.distributed.elastic from inside the script: elastic_launch with a
LaunchConfig on a function of the script (`launch` in argv), or torch.distributed.run.main(argv) on the script itself
(`run`, the default), whose ranks run the script again with LOCAL_RANK set. One cuda device a rank; `no-ddp` in argv
trains each rank's model on its own, never all-reducing its gradients."""

import os
import sys
import uuid

import torch
import torch.distributed as dist
from torch.distributed.launcher.api import LaunchConfig, elastic_launch
from torch.nn.parallel import DistributedDataParallel

RANKS = 2


def train() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.cuda.set_device(rank)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).to(rank)
    if "no-ddp" not in sys.argv:
        model = DistributedDataParallel(model, device_ids=[rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    generator = torch.Generator().manual_seed(rank)
    for _ in range(3):
        optimizer.zero_grad()
        inputs, targets = torch.randn(4, 6, generator=generator), torch.randn(4, 1, generator=generator)
        torch.nn.functional.mse_loss(model(inputs.to(rank)), targets.to(rank)).backward()
        optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    if "LOCAL_RANK" in os.environ:  # a rank torch.distributed.run started
        train()
    elif "launch" in sys.argv:
        config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=RANKS, run_id=str(uuid.uuid4()),
                              rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0, monitor_interval=0.1)
        elastic_launch(config, train)()
    else:
        from torch.distributed.run import main

        main(["--standalone", "--nproc-per-node", str(RANKS), "--monitor-interval", "0.1", __file__, *sys.argv[1:]])
