"""A torchrun-style DDP trainer whose rank 1 fails at step 2 as the first argument says: "hang" (it sleeps before
its forward, so rank 0 waits in the all-reduce of that step's gradients), "hang-deaf" (it hangs ignoring SIGTERM, as a
script whose handler saves a checkpoint first may), "crash" (it raises), or "none"."""

import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

FAILING_RANK, FAILING_STEP = 1, 2
MODE = sys.argv[1]

dist.init_process_group("gloo")
torch.manual_seed(0)
model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
generator = torch.Generator().manual_seed(int(os.environ["RANK"]))
for step in range(10):
    if dist.get_rank() == FAILING_RANK and step == FAILING_STEP and MODE != "none":
        if MODE == "hang-deaf":
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if MODE.startswith("hang"):
            print("rank 1 hangs", flush=True)
            time.sleep(3600)
        raise RuntimeError("rank 1 fails on purpose")
    loss = model(torch.randn(8, 4, generator=generator)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
dist.destroy_process_group()
