"""A script that is not constant from run to run: its forward adds noise from a generator seeded with the clock, which
the seed verify installs does not reach. `verify determinism` must name that randn."""

import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Noisy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 2)
        self.clock = torch.Generator().manual_seed(time.time_ns())

    def forward(self, x):
        return self.linear(x + 0.1 * torch.randn(x.shape, generator=self.clock))


model = Noisy()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
inputs, targets = torch.randn(16, 8), torch.randint(0, 2, (16,))
for step in range(10):
    optimizer.zero_grad()
    loss = F.cross_entropy(model(inputs), targets)
    loss.backward()
    optimizer.step()
