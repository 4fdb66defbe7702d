"""A small MLP with two dropouts trained for a few steps."""
import torch
import torch.nn as nn

device = "cuda" if torch.cuda.is_available() else "cpu"
features = torch.randn(256, 16)
labels = torch.randint(0, 4, (256,))
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 32), nn.ReLU(), nn.Dropout(0.1),
                      nn.Linear(32, 4)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(8):
    x, y = features[step * 32:(step + 1) * 32].to(device), labels[step * 32:(step + 1) * 32].to(device)
    optimizer.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    print(f"step {step} loss {loss.item():.4f}")
