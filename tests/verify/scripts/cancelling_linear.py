"""A linear layer whose output cancels the common offset of its two inputs: fp32 keeps their small difference, a
10-bit mantissa (TF32 on a GPU, HF32 on an NPU) rounds it away. tests/verify/test_environment.py compares it with a
port that switches HF32 on.
"""

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
features = 1.0 + 1e-3 * torch.randn(64, 2)
targets = torch.randn(64, 1)
loader = DataLoader(TensorDataset(features, targets), batch_size=16)
model = nn.Linear(2, 1).to(device)
with torch.no_grad():
    model.weight.copy_(torch.tensor([[1.0, -1.0]]))
    model.bias.zero_()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in loader:
    x, y = x.to(device), y.to(device)
    optimizer.zero_grad()
    loss = ((model(x) * 1000 - y) ** 2).mean()
    loss.backward()
    optimizer.step()
