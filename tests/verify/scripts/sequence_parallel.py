"""A tiny sequence-parallel training for torchrun on GPUs: each rank holds its rows of the batch (Shard(0)), which
the first layer gathers (a functional all_gather_into_tensor) before its column-wise product, and the second
scatters back (reduce_scatter_tensor). The batch's rows are 0..15 of a ramp, so the gathered batch's extremes are
known: 0 and 1."""

import os

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

device_type = torch.accelerator.current_accelerator().type
mesh = init_device_mesh(device_type, (int(os.environ["WORLD_SIZE"]),))
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8)).to(device_type)
model = parallelize_module(model, mesh, {"0": ColwiseParallel(input_layouts=Shard(0)),
                                          "2": RowwiseParallel(output_layouts=Shard(0))})
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
rows = torch.linspace(0, 1, 16 * 8).reshape(16, 8).chunk(mesh.size())[mesh.get_rank()].to(device_type)
for step in range(4):
    loss = model(rows).square().mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
torch.distributed.destroy_process_group()
