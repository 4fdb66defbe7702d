"""An fp32 training step whose loss is the mean of a Gram matrix of small activations (about 1e-7): exact in fp32;
below fp16's normal range (6e-5) when `migrate`'s AMP101 runs that line under float16 autocast, where the matrix
product rounds to fp16's subnormals. Issue 34: a divergence made on a line migrate rewrote."""
import torch
from torch import nn


def main():
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = nn.Linear(16, 16, bias=False).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(2):
        features = 1e-4 * torch.randn(8, 16, device=device)
        optimizer.zero_grad()
        output = model(features)
        loss = (output @ output.t()).mean()
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.4g}")


if __name__ == "__main__":
    main()
