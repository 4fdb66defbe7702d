"""The faithful port of verdict_mlp.py to the NPU (explicit mode, fp32): tests/verify/test_verdicts.py breaks copies
of it one way at a time. `dtype` is the precision the port trains in.
"""

import argparse

import numpy as np
import torch
import torch_npu
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=1)
parser.add_argument("--lr", type=float, default=1e-4)
args = parser.parse_args()

device = torch.device("npu" if torch.npu.is_available() else "cpu")
dtype = torch.float32
rng = np.random.default_rng(0)
features = rng.standard_normal((256, 16), dtype=np.float32)
targets = (features @ rng.standard_normal((16, 4), dtype=np.float32) * 20).astype(np.float32)
loader = DataLoader(TensorDataset(torch.from_numpy(features), torch.from_numpy(targets)), batch_size=32, shuffle=False)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.hidden = nn.Linear(16, 32)
        self.act = nn.ReLU()
        self.out = nn.Linear(32, 4)

    def forward(self, x):
        return self.out(self.act(self.hidden(x)))


model = Net().to(device, dtype)
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
for epoch in range(args.epochs):
    for step, (x, y) in enumerate(loader):
        x, y = x.to(device, dtype), y.to(device, dtype)
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), y, reduction="sum") / len(x)
        loss.backward()
        optimizer.step()
        print(f"epoch {epoch} step {step} loss {loss.item():.4f}")
