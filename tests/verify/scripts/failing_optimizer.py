"""An optimizer whose second step() raises: the run must end 'crashed' with this script's own error."""

import torch

model = torch.nn.Linear(4, 1)


class Fragile(torch.optim.SGD):
    steps = 0

    def step(self, closure=None):
        Fragile.steps += 1
        if Fragile.steps == 2:
            raise RuntimeError("the optimizer broke at its second step")
        return super().step(closure)


optimizer = Fragile(model.parameters(), lr=0.1)
for _ in range(3):
    optimizer.zero_grad()
    model(torch.randn(8, 4)).pow(2).mean().backward()
    optimizer.step()
