"""Trains two steps, then hangs (the timeout must kill it and keep the two steps)."""

import time

import torch

model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(2):
    model(torch.randn(8, 4)).pow(2).mean().backward()
    optimizer.step()
    optimizer.zero_grad()
print("steps done; now hanging", flush=True)
while True:
    time.sleep(1)
