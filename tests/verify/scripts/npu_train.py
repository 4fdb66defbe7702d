"""A ported script: imports torch_npu and trains on the "npu" device (the real one, or verify's emulated one)."""

import torch
import torch_npu  # noqa: F401

device = torch.device("npu:0")
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(10):
    inputs, targets = torch.randn(8, 4).to(device), torch.randint(0, 2, (8,)).to(device)
    loss = torch.nn.functional.cross_entropy(model(inputs), targets)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
