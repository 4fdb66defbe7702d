"""A script that resumes from its own checkpoint, as most real trainers do (HF Trainer's output_dir too): where
`out/ckpt.pt` is there it loads the model, optimizer and step from it, and it saves one every step. It writes a log
beside it (appended to) and a checkpoint through an absolute path built from its own file (`--absolute`)."""

import argparse
import os
from pathlib import Path

import torch
import torch.nn as nn

parser = argparse.ArgumentParser()
parser.add_argument("--out", default="out")
parser.add_argument("--lr", type=float, default=0.05)
parser.add_argument("--epochs", type=int, default=40)
args = parser.parse_args()

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
inputs, targets = torch.randn(64, 6), torch.randn(64, 1)
checkpoint = os.path.join(args.out, "ckpt.pt")
start = 0
if os.path.exists(checkpoint):
    state = torch.load(checkpoint, weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    start = int(state["step"])
    print(f"resumed from step {start}")
os.makedirs(args.out, exist_ok=True)
beside = Path(__file__).resolve().parent / "seen_steps.txt"
for step in range(start, start + args.epochs):
    batch = slice(8 * (step % 8), 8 * (step % 8) + 8)
    optimizer.zero_grad()
    loss = nn.functional.mse_loss(model(inputs[batch]), targets[batch])
    loss.backward()
    optimizer.step()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step + 1}, checkpoint)
    with open(os.path.join(args.out, "train.log"), "a") as log:
        log.write(f"{step} {loss.item():.6f}\n")
    with open(beside, "a") as seen:
        seen.write(f"{step}\n")
