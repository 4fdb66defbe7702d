"""A training script that draws random tensors on the device in every step (input noise, as a denoising model or a
VAE draws them), written as a GPU user writes it. tests/verify/test_verdicts.py pairs it with a port that draws one
more random tensor before training: with verify's keyed stream both sides still get the same noise."""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=6)
args = parser.parse_args()

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
features = torch.randn(192, 24)
targets = features @ torch.randn(24, 3)
model = nn.Sequential(nn.Linear(24, 48), nn.Tanh(), nn.Linear(48, 3)).to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
for step in range(args.steps):
    x = features[step * 32:(step + 1) * 32].to(device)
    y = targets[step * 32:(step + 1) * 32].to(device)
    noisy = x + 0.5 * torch.randn(x.shape, device=device)
    optimizer.zero_grad()
    loss = F.mse_loss(model(noisy), y)
    loss.backward()
    optimizer.step()
    print(f"step {step} loss {loss.item():.5f}")
