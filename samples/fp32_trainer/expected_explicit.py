"""Tabular regression with a residual MLP, trained in full fp32 precision.

    python train_gpu.py --epochs 30 --batch-size 256
"""
import argparse
import os

import torch
import torch_npu
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

# AMP101 mixed precision: one loss scaler, shared by every training function
scaler = torch.amp.GradScaler("npu")


def make_dataset(num_rows, num_features):
    """Rows of features and a smooth nonlinear target with noise, standing in for a feature table."""
    features = torch.randn(num_rows, num_features)
    weights = torch.linspace(-1, 1, num_features)
    target = torch.sin(features @ weights) + 0.5 * features[:, 0] * features[:, 1] + 0.1 * torch.randn(num_rows)
    return TensorDataset(features, target.unsqueeze(1))


class ResidualBlock(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.net = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width), nn.GELU(), nn.Linear(width, width))

    def forward(self, x):
        return x + self.net(x)


class Regressor(nn.Module):
    def __init__(self, num_features, width, depth):
        super().__init__()
        self.inp = nn.Linear(num_features, width)
        self.blocks = nn.Sequential(*(ResidualBlock(width) for _ in range(depth)))
        self.out = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, 1))

    def forward(self, x):
        return self.out(self.blocks(self.inp(x)))


def train(model, loader, optimizer, epoch):
    model.train()
    criterion = nn.MSELoss()
    device = next(model.parameters()).device
    for step, (features, target) in enumerate(loader):
        features, target = features.to(device), target.to(device)
        optimizer.zero_grad()
        with torch.autocast(device_type="npu", dtype=torch.float16):
            loss = criterion(model(features), target)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        if step % 20 == 0:
            print(f"epoch {epoch} step {step}/{len(loader)} loss {loss.item():.4f}")


def validate(model, loader):
    criterion = nn.MSELoss()
    device = next(model.parameters()).device
    total_loss = 0
    for features, target in loader:
        features, target = features.to(device), target.to(device)
        loss = criterion(model(features), target)
        total_loss += loss
    return total_loss / len(loader)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--rows", type=int, default=100_000, help="training rows (validation: a fifth of that)")
    parser.add_argument("--features", type=int, default=32)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--depth", type=int, default=4)
    args = parser.parse_args()

    device = "npu" if torch.npu.is_available() else "cpu"
    train_set = make_dataset(args.rows, args.features)
    val_set = make_dataset(args.rows // 5, args.features)
    # keep the GPU fed: one loader process per core, at most eight
    workers = min(8, os.cpu_count() or 1)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True, num_workers=workers,
                              pin_memory=True)
    val_loader = DataLoader(val_set, batch_size=args.batch_size, num_workers=workers, pin_memory=True)

    model = Regressor(args.features, args.width, args.depth).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    for epoch in range(args.epochs):
        train(model, train_loader, optimizer, epoch)
        val_loss = validate(model, val_loader)
        print(f"epoch {epoch} validation loss {val_loss.item():.4f}")
    torch.save(model.state_dict(), "regressor.pt")


if __name__ == "__main__":
    main()
