"""A style-transfer-shaped training (pytorch/examples fast_neural_style): a small net trained through a frozen "loss
network" larger than it, which runs once before the loop (the style target) and whose optimizer is made after that
call. The steps are the small net's; the loss network is frozen. --by-hand updates the net without an optimizer."""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--by-hand", action="store_true")
args = parser.parse_args()

torch.manual_seed(0)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
loss_network = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(),
                             nn.Conv2d(32, 16, 3, padding=1)).to(device)
loss_network.requires_grad_(False)
style = torch.rand(1, 3, 16, 16, device=device)
style_target = loss_network(style)

transformer = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 3, 3, padding=1)).to(device)
optimizer = None if args.by_hand else torch.optim.Adam(transformer.parameters(), lr=1e-3)
for step in range(args.steps):
    x = torch.rand(2, 3, 16, 16, device=device)
    transformer.zero_grad()
    y = transformer(x)
    loss = F.mse_loss(loss_network(y), style_target.expand(2, -1, -1, -1)) + F.mse_loss(y, x)
    loss.backward()
    if optimizer is None:
        with torch.no_grad():
            for parameter in transformer.parameters():
                parameter.add_(parameter.grad, alpha=-0.01)
    else:
        optimizer.step()
    print(f"step {step} loss {loss.item():.4f}")
