"""The reference of the verdict tests: a small MLP regression on synthetic data, written as a GPU user writes it.

tests/verify/test_verdicts.py runs it against verdict_mlp_npu.py (its faithful port) and against broken copies of
that port. The targets are large on purpose: a sum-reduced loss of them overflows half precision but not single.
"""

import argparse

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=1)
parser.add_argument("--lr", type=float, default=1e-4)
args = parser.parse_args()

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
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


model = Net().to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
for epoch in range(args.epochs):
    for step, (x, y) in enumerate(loader):
        x, y = x.to(device), y.to(device)
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), y, reduction="sum") / len(x)
        loss.backward()
        optimizer.step()
        print(f"epoch {epoch} step {step} loss {loss.item():.4f}")
