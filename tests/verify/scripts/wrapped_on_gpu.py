"""A model wrapped in DataParallel only where CUDA is available (pytorch/examples imagenet does so): on an NPU, or
the CPU, the same model runs unwrapped."""

import torch
import torch.nn as nn


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(x)


torch.manual_seed(0)
model = Net()
if torch.cuda.is_available():
    model = nn.DataParallel(model).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    optimizer.zero_grad()
    model(torch.randn(8, 4)).pow(2).mean().backward()
    optimizer.step()
