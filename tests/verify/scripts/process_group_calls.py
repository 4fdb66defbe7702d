"""The process-group calls Trainer, accelerate and Lightning make, on the NPU (the port of a torchrun script): a
process group with torch's own choice of backend (hccl on an NPU), barrier() (main_process_first, wait_for_everyone)
with and without device_ids, the object collectives, new_group, and monitored_barrier on a gloo group (Lightning's
infinite barrier). Each call's result is checked, then a DDP model trains."""

import torch
import torch_npu  # noqa: F401
import torch.distributed as dist

dist.init_process_group()
rank, world = dist.get_rank(), dist.get_world_size()
torch.npu.set_device(rank)
dist.barrier()
dist.barrier(device_ids=[rank])
sent = [{"from": rank}] if rank == 0 else [None]
dist.broadcast_object_list(sent, src=0)
every = [None] * world
dist.all_gather_object(every, rank)
gathered = [None] * world if rank == 0 else None
dist.gather_object(rank, gathered, dst=0)
assert sent == [{"from": 0}] and every == list(range(world)) and (rank != 0 or gathered == every), (sent, every)
dist.barrier(group=dist.new_group(list(range(world))))
dist.monitored_barrier(group=dist.new_group(backend="gloo"))
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1).npu(), device_ids=[rank])
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    optimizer.zero_grad()
    model(torch.ones(2, 4, device="npu")).pow(2).mean().backward()
    optimizer.step()
dist.destroy_process_group()
