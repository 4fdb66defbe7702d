"""Trains a few steps on gloo (hccl on the emulated NPU with --npu), destroys its process group and writes the
names of the threads still running into the file its first argument names: after destroy_process_group, torch alone
leaves a gloo group no thread (tests/verify/test_sharded.py); under verify's capture the group is kept until the process
ends (tests/verify/test_run.py)."""

import json
import os
import sys

import torch
import torch.distributed as dist

on_npu = "--npu" in sys.argv
if on_npu:
    import torch_npu  # noqa: F401
device = "npu" if on_npu else "cpu"
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
dist.init_process_group("hccl" if on_npu else "gloo", rank=0, world_size=1)
model = torch.nn.Linear(4, 2).to(device)  # no DDP: its reducer would hold the group
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
try:
    for _ in range(3):
        model(torch.randn(8, 4, device=device)).square().mean().backward()
        for parameter in model.parameters():
            dist.all_reduce(parameter.grad)
        optimizer.step()
        optimizer.zero_grad()
finally:
    dist.destroy_process_group()
    tasks = f"/proc/{os.getpid()}/task"
    names = [open(f"{tasks}/{task}/comm").read().strip() for task in os.listdir(tasks)]
    with open(sys.argv[1], "w") as threads:
        json.dump(sorted(names), threads)
