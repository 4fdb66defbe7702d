"""A small convolutional network on MNIST-shaped digits (synthetic strokes, so no download is needed)."""
import argparse
import math

import torch
import torch_npu
from torch_npu.contrib import transfer_to_npu
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.optim.lr_scheduler import StepLR
from torch.utils.data import DataLoader, Dataset
import random

MNIST_MEAN, MNIST_STD = 0.1307, 0.3081

# AMP101 mixed precision: one loss scaler, shared by every training function
scaler = torch.amp.GradScaler("npu")


class SyntheticDigits(Dataset):
    """28x28 grey images of ten stroke patterns (one per class) with jitter and noise, normalised like MNIST.

    Learnable but not trivial, so the loss falls over the first few hundred steps as it does on real MNIST.
    """

    def __init__(self, size, seed):
        generator = torch.Generator().manual_seed(seed)
        self.targets = torch.randint(10, (size,), generator=generator)
        angles = self.targets.float() * (math.pi / 10) + 0.2 * torch.randn(size, generator=generator)
        grid = torch.linspace(-1, 1, 28)
        ys, xs = torch.meshgrid(grid, grid, indexing="ij")
        # Each class is a bar through the centre at its own angle: distance of each pixel to that line.
        distance = (xs * torch.sin(angles)[:, None, None] - ys * torch.cos(angles)[:, None, None]).abs()
        images = torch.exp(-(distance / 0.15) ** 2) + 0.1 * torch.rand(size, 28, 28, generator=generator)
        self.images = ((images.clamp(0, 1) - MNIST_MEAN) / MNIST_STD).unsqueeze(1)

    def __len__(self):
        return len(self.targets)

    def __getitem__(self, index):
        return self.images[index], int(self.targets[index])


class Net(nn.Module):
    """Two conv/pool stages and a two-layer classifier head; log-probabilities out (for nll_loss)."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Dropout(0.25),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(64 * 7 * 7, 128),
            nn.ReLU(),
            nn.Dropout(0.5),
            nn.Linear(128, 10),
        )

    def forward(self, x):
        return F.log_softmax(self.classifier(self.features(x)), dim=1)


def train(args, model, device, train_loader, optimizer, epoch):
    model.train()
    for batch_idx, (data, target) in enumerate(train_loader):
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        with torch.autocast(device_type="npu", dtype=torch.float16):
            output = model(data)
            loss = F.nll_loss(output, target)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        if batch_idx % args.log_interval == 0:
            seen = batch_idx * len(data)
            print(f"Train Epoch: {epoch} [{seen}/{len(train_loader.dataset)} "
                  f"({100.0 * batch_idx / len(train_loader):.0f}%)]\tLoss: {loss.item():.6f}")
            if args.dry_run:
                break


def test(model, device, test_loader):
    model.eval()
    test_loss = 0
    correct = 0
    with torch.no_grad():
        for data, target in test_loader:
            data, target = data.to(device), target.to(device)
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction="sum").item()
            correct += (output.argmax(dim=1) == target).sum().item()

    total = len(test_loader.dataset)
    test_loss /= total
    print(f"\nTest set: Average loss: {test_loss:.4f}, Accuracy: {correct}/{total} ({100.0 * correct / total:.0f}%)\n")


def main():
    parser = argparse.ArgumentParser(description="MNIST-style CNN")
    parser.add_argument("--batch-size", type=int, default=64, metavar="N", help="training batch size (default: 64)")
    parser.add_argument("--test-batch-size", type=int, default=1000, metavar="N", help="test batch size")
    parser.add_argument("--epochs", type=int, default=14, metavar="N", help="epochs (default: 14)")
    parser.add_argument("--lr", type=float, default=1.0, metavar="LR", help="Adadelta learning rate (default: 1.0)")
    parser.add_argument("--gamma", type=float, default=0.7, metavar="M", help="lr decay per epoch (default: 0.7)")
    parser.add_argument("--no-cuda", action="store_true", default=False, help="train on the CPU even with a GPU")
    parser.add_argument("--dry-run", action="store_true", default=False, help="one batch per epoch, to smoke-test")
    parser.add_argument("--seed", type=int, default=1, metavar="S", help="random seed (default: 1)")
    parser.add_argument("--log-interval", type=int, default=10, metavar="N", help="batches between log lines")
    parser.add_argument("--save-model", action="store_true", default=False, help="save the trained weights")
    parser.add_argument("--train-size", type=int, default=60000, help="number of training images")
    parser.add_argument("--test-size", type=int, default=10000, help="number of test images")
    args = parser.parse_args()
    use_cuda = not args.no_cuda and torch.cuda.is_available()

    torch.manual_seed(args.seed)
    random.seed(args.seed)

    device = torch.device("cuda" if use_cuda else "cpu")

    train_kwargs = {"batch_size": args.batch_size}
    test_kwargs = {"batch_size": args.test_batch_size}
    if use_cuda:
        cuda_kwargs = {"num_workers": 1, "pin_memory": True, "shuffle": True}
        train_kwargs.update(cuda_kwargs)
        test_kwargs.update(cuda_kwargs)

    train_set = SyntheticDigits(args.train_size, seed=args.seed)
    test_set = SyntheticDigits(args.test_size, seed=args.seed + 1)
    train_loader = DataLoader(train_set, **train_kwargs)
    test_loader = DataLoader(test_set, **test_kwargs)

    model = Net().to(device)
    optimizer = optim.Adadelta(model.parameters(), lr=args.lr)

    scheduler = StepLR(optimizer, step_size=1, gamma=args.gamma)
    for epoch in range(1, args.epochs + 1):
        train(args, model, device, train_loader, optimizer, epoch)
        test(model, device, test_loader)
        scheduler.step()

    if args.save_model:
        torch.save(model.state_dict(), "mnist_cnn.pt")


if __name__ == "__main__":
    main()
