"""A data-parallel trainer by hand, torchrun-style (2 ranks, gloo): rank 0's initial parameters broadcast to every
rank, each rank's gradients summed and split with reduce_scatter, each rank's shard of the averaged gradient gathered
back with all_gather, then the step. argv[1] "no-broadcast": the ranks keep their own (differently seeded)
initial parameters."""

import sys

import torch
import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(rank)  # each rank its own initial parameters: the broadcast makes them rank 0's
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    if sys.argv[1:] != ["no-broadcast"]:
        for parameter in model.parameters():
            dist.broadcast(parameter.data, src=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(100 + rank)
    for _ in range(4):
        optimizer.zero_grad()
        inputs, targets = torch.randn(8, 4, generator=generator), torch.randn(8, 2, generator=generator)
        torch.nn.functional.mse_loss(model(inputs), targets).backward()
        flat = torch.cat([parameter.grad.flatten() for parameter in model.parameters()])
        padded = torch.nn.functional.pad(flat, (0, -len(flat) % world))
        shard = torch.empty(len(padded) // world)
        dist.reduce_scatter(shard, list(padded.chunk(world)))
        shards = [torch.empty_like(shard) for _ in range(world)]
        dist.all_gather(shards, shard / world)
        averaged = torch.cat(shards)[: len(flat)]
        offset = 0
        for parameter in model.parameters():
            parameter.grad.copy_(averaged[offset: offset + parameter.numel()].view_as(parameter))
            offset += parameter.numel()
        optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
