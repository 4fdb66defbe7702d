"""never_zeroed_sum_loss.py ported by hand to fp16 autocast and a GradScaler, as migrate ported it before it left
loops that never clear their gradients in float32: the scaled loss overflows the fp16 gradients at the first scale,
nothing resets them, and every later step overflows too, whatever the scale: the port never trains."""

import torch
import torch_npu
from torch_npu.contrib import transfer_to_npu
import random

torch.manual_seed(0)
random.seed(0)
model = torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.ReLU(), torch.nn.Linear(32, 5)).cuda()
optimizer = torch.optim.AdamW(model.parameters(), lr=0.25)
scaler = torch.amp.GradScaler("npu")
for step in range(10):
    torch.manual_seed(step)
    with torch.autocast(device_type="npu", dtype=torch.float16):
        output = model(torch.rand(20, 10, device="cuda"))
    scaler.scale(output.sum()).backward()
    scaler.step(optimizer)
    scaler.update()
