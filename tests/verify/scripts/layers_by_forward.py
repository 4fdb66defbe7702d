"""A model whose layers train one by one, each called through .forward() and never as a module, each with its own
optimizer (the layer-local training of forward-forward networks): verify sees no outermost module. Its port, as
migrate writes it, trains it under float16 autocast with one GradScaler."""

import torch
import torch.nn as nn

torch.manual_seed(0)
device = "cuda"


class Layer(nn.Linear):
    def __init__(self, width: int) -> None:
        super().__init__(width, width)
        self.act = nn.ReLU()
        self.opt = torch.optim.Adam(self.parameters(), lr=0.03)

    def forward(self, x):
        return self.act(torch.mm(x, self.weight.T) + self.bias)

    def fit(self, x):
        for _ in range(4):
            loss = torch.log1p(torch.exp(2.0 - self.forward(x).pow(2).mean(1))).mean()
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
        return self.forward(x).detach()


layers = [Layer(64).to(device) for _ in range(2)]
h = torch.randn(128, 64).to(device)
for layer in layers:
    h = layer.fit(h)
