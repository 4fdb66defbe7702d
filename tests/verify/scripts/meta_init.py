"""A model built on the meta device, given memory by to_empty and then initialized as the first argument says:
"all" (every module's reset_parameters), "head" (only the head's: the body's parameters are left as allocated),
"data" (the body's parameters replaced by `.data =`), "assign" (a state dict loaded with assign=True), "norm" (with a
batch norm after the head whose parameters alone are set: its running statistics are left as allocated)."""

import sys

import torch

how = sys.argv[1]
torch.manual_seed(0)
with torch.device("meta"):
    layers = [torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2)]
    model = torch.nn.Sequential(*layers, *([torch.nn.BatchNorm1d(2)] if how == "norm" else []))
body, head = model[0], model[2]
model.to_empty(device="cpu")
head.reset_parameters()
if how in ("all", "norm"):
    body.reset_parameters()
elif how == "data":
    for parameter in body.parameters():
        parameter.data = torch.randn_like(parameter)
elif how == "assign":
    body.load_state_dict(torch.nn.Linear(4, 8).state_dict(), assign=True)
if how == "norm":
    torch.nn.init.ones_(model[3].weight)
    torch.nn.init.zeros_(model[3].bias)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    model(torch.randn(16, 4)).square().mean().backward()
    optimizer.step()
    optimizer.zero_grad()
