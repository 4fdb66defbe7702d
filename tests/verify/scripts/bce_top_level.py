"""A tiny binary classifier whose loss is the functional binary cross entropy on a sigmoid, at the top level."""
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
features = torch.randn(64, 8)
labels = (features.sum(1, keepdim=True) > 0).float()
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(6):
    batch = slice(step * 8 % 64, step * 8 % 64 + 8)
    x, y = features[batch].to(device), labels[batch].to(device)
    optimizer.zero_grad()
    loss = F.binary_cross_entropy(torch.sigmoid(model(x)), y)
    loss.backward()
    optimizer.step()
    print(f"step {step} loss {loss.item():.4f}")
