"""A trainer whose training runs in multiprocessing.Process workers (as hogwild does): each worker trains its own
seeded model for a few steps; the main process only starts and joins them. START_METHOD: fork or spawn."""

import sys

import torch
import torch.multiprocessing as mp


def train(rank: int, steps: int) -> None:
    torch.manual_seed(rank)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(torch.randn(8, 4)), torch.randn(8, 1)).backward()
        optimizer.step()


if __name__ == "__main__":
    context = mp.get_context(sys.argv[1] if len(sys.argv) > 1 else "spawn")
    workers = [context.Process(target=train, args=(rank, 3)) for rank in range(2)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
