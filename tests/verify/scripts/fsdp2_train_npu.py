"""fsdp2_train.py as `migrate` ports it (transfer mode: two imports; migrate --amp off).

A tiny FSDP2 training (fully_shard on each layer and the model, as pytorch/examples' FSDP2 example does), written
for torchrun on GPUs: the device from torch.accelerator, the backend from the device, the process group bound to
it. Every rank reads the same batches, so that the gradients FSDP2 averages equal those of one process.
`--unsharded`: the same model and batches in one process, no process group, no sharding. `--tensor-parallel`: a 2-D
mesh, each layer split column- then row-wise across its second dimension (Megatron's MLP) and sharded by FSDP2
across its first."""

import sys

import torch
import torch_npu
from torch_npu.contrib import transfer_to_npu
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module


def model_on(device: torch.device) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).to(device)


def sharded(model: torch.nn.Module, device: torch.device, tensor_parallel: bool) -> torch.nn.Module:
    backend = torch.distributed.get_default_backend_for_device(device)
    torch.distributed.init_process_group(backend=backend, device_id=device)
    mesh = None
    if tensor_parallel:
        world = torch.distributed.get_world_size()
        mesh = init_device_mesh(device.type, (world // 2, 2), mesh_dim_names=("dp", "tp"))
        model = parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
        mesh = mesh["dp"]
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def main(unsharded: bool, tensor_parallel: bool) -> None:
    device_type = torch.accelerator.current_accelerator()
    index = 0 if unsharded else int(__import__("os").environ["LOCAL_RANK"])
    torch.accelerator.device_index(index)
    device = torch.device(f"{device_type}:{index}")
    model = model_on(device) if unsharded else sharded(model_on(device), device, tensor_parallel)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    for step in range(4):
        batch = torch.randn(8, 8, generator=torch.Generator().manual_seed(step)).to(device)
        loss = model(batch).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    if not unsharded:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main("--unsharded" in sys.argv[1:], "--tensor-parallel" in sys.argv[1:])
