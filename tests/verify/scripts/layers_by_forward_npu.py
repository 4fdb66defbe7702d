"""The port of layers_by_forward.py to the NPU, as migrate ports it: float16 autocast and one GradScaler."""

import torch
import torch.nn as nn
import torch_npu

scaler = torch.amp.GradScaler("npu")

torch.manual_seed(0)
device = "npu"


class Layer(nn.Linear):
    def __init__(self, width: int) -> None:
        super().__init__(width, width)
        self.act = nn.ReLU()
        self.opt = torch.optim.Adam(self.parameters(), lr=0.03)

    def forward(self, x):
        return self.act(torch.mm(x, self.weight.T) + self.bias)

    def fit(self, x):
        for _ in range(4):
            with torch.autocast(device_type="npu", dtype=torch.float16):
                loss = torch.log1p(torch.exp(2.0 - self.forward(x).pow(2).mean(1))).mean()
            self.opt.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(self.opt)
            scaler.update()
        return self.forward(x).detach()


layers = [Layer(64).to(device) for _ in range(2)]
h = torch.randn(128, 64).to(device)
for layer in layers:
    h = layer.fit(h)
