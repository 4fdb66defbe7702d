"""A script written for one GPU the way pytorch/examples write them: it picks its device from torch.accelerator,
wraps its model in DataParallel, pins memory, and shuffles only on the accelerator. Prints what it saw."""

import json

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

use_accel = torch.accelerator.is_available()
device = torch.accelerator.current_accelerator() if use_accel else torch.device("cpu")
model = nn.DataParallel(nn.Linear(4, 2)).cuda() if device.type == "cuda" else nn.Linear(4, 2)
data = TensorDataset(torch.randn(32, 4), torch.randint(0, 2, (32,)))
loader = DataLoader(data, batch_size=8, shuffle=use_accel, pin_memory=use_accel)
optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
print("SAW", json.dumps({"device": str(device), "cuda": torch.cuda.is_available(),
                         "name": torch.cuda.get_device_name(0) if torch.cuda.is_available() else ""}), flush=True)
for x, y in loader:
    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
    optimizer.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()
