"""Runs its model forward and backward ten times but never calls optimizer.step(): a run without a step."""

import torch

model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(10):
    optimizer.zero_grad()
    model(torch.randn(2, 4)).sum().backward()
