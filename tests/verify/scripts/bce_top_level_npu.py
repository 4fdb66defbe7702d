"""bce_top_level.py ported by hand: the model's forward under fp16 autocast and a GradScaler; the functional binary
cross entropy stays outside autocast (CUDA and NPU autocast refuse it), on float32 inputs."""
import torch
import torch_npu
from torch_npu.contrib import transfer_to_npu
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
features = torch.randn(64, 8)
labels = (features.sum(1, keepdim=True) > 0).float()
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
scaler = torch.amp.GradScaler("cuda")
for step in range(6):
    batch = slice(step * 8 % 64, step * 8 % 64 + 8)
    x, y = features[batch].to(device), labels[batch].to(device)
    optimizer.zero_grad()
    with torch.autocast(device_type="cuda", dtype=torch.float16):
        logits = model(x)
    loss = F.binary_cross_entropy(torch.sigmoid(logits.float()), y)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    print(f"step {step} loss {loss.item():.4f}")
