"""Training without an optimizer, as pytorch/examples word_language_model does by default: the model and the loss
are two outermost modules, and the parameters are updated by hand after backward(); then an evaluation, forwards
without a backward, as that script makes once its data ends."""

import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
criterion = torch.nn.CrossEntropyLoss()
for batch in range(6):
    model.zero_grad()
    loss = criterion(model(torch.randn(4, 6)), torch.randint(0, 3, (4,)))
    loss.backward()
    for parameter in model.parameters():
        parameter.data.add_(parameter.grad, alpha=-0.1)
    print(batch, loss.item())

with torch.no_grad():
    for batch in range(2):
        print("eval", batch, criterion(model(torch.randn(4, 6)), torch.randint(0, 3, (4,))).item())
