"""A tiny CNN trained on synthetic data: the common case. Flags exercise the loop's variants."""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=100)
parser.add_argument("--accumulate", type=int, default=1, help="backward() calls per optimizer step")
parser.add_argument("--nan-at", type=int, default=-1, help="make the loss NaN at this step")
parser.add_argument("--exit-after", type=int, default=-1, help="sys.exit(EXIT_CODE) after this many steps")
parser.add_argument("--exit-code", type=int, default=0)
parser.add_argument("--crash-at", type=int, default=-1, help="raise at this step")
parser.add_argument("--scaler", action="store_true", help="use a GradScaler")
parser.add_argument("--overflow", action="store_true", help="an infinite GradScaler scale: every step is skipped")
parser.add_argument("--adam", action="store_true")
args = parser.parse_args()


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.drop = nn.Dropout(0.5)
        self.head = nn.Linear(4 * 4 * 4, 3)

    def forward(self, x):
        x = F.max_pool2d(torch.relu(self.conv(x)), 2)
        return self.head(self.drop(x.flatten(1)))


model = Net()
optimizer = (torch.optim.Adam if args.adam else torch.optim.SGD)(model.parameters(), lr=0.05, weight_decay=1e-4)
scaler = torch.amp.GradScaler("cpu", init_scale=float("inf") if args.overflow else 2.0**8) if args.scaler else None
inputs, targets = torch.randn(8, 1, 8, 8), torch.randint(0, 3, (8,))
step = 0
for epoch in range(args.epochs):
    for micro in range(args.accumulate):
        loss = F.cross_entropy(model(inputs), targets) / args.accumulate
        if step == args.nan_at:
            loss = loss * float("nan")
        if step == args.crash_at:
            raise RuntimeError(f"boom at step {step}")
        (scaler.scale(loss) if scaler else loss).backward()
    if scaler:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    optimizer.zero_grad()
    step += 1
    print(f"step {step} loss {loss.item():.4f}")
    if step == args.exit_after:
        import sys

        sys.exit(args.exit_code)
