"""A GPU trainer that never resets its gradients (no zero_grad) and backpropagates a sum over its outputs, as
pytorch/examples' tensor-parallel toy does. An fp16 port with a GradScaler (never_zeroed_sum_loss_npu.py) overflows at
its first scale, and the inf then stays in the gradients that every later backward() adds to: the port never trains.
migrate leaves this loop in float32 (AMP105)."""

import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.ReLU(), torch.nn.Linear(32, 5)).cuda()
optimizer = torch.optim.AdamW(model.parameters(), lr=0.25)
for step in range(10):
    torch.manual_seed(step)
    output = model(torch.rand(20, 10, device="cuda"))
    output.sum().backward()
    optimizer.step()
