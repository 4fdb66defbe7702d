"""A float16 trainer with a `--device` option that makes its loss scaler for CUDA only, as timm's train.py does
(`device.type in ('cuda',)`), though it handles the NPU elsewhere: a port that defaults the option to "npu" and keeps
that test trains unscaled on the NPU. Its loss is small, so its float16 gradients need the scale."""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
device = torch.device(parser.parse_args().device)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
scaler = torch.amp.GradScaler(device.type) if device.type in ("cuda",) else None
inputs, targets = torch.randn(48, 16), torch.randn(48, 4)
for step in range(6):
    x, y = inputs[step * 8:(step + 1) * 8].to(device), targets[step * 8:(step + 1) * 8].to(device)
    optimizer.zero_grad()
    with torch.autocast(device.type, dtype=torch.float16):
        loss = F.mse_loss(model(x), y) * 1e-6
    if scaler is not None:
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    else:
        loss.backward()
        optimizer.step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    elif device.type == "npu":
        torch.npu.synchronize()
    print(step, loss.item())
