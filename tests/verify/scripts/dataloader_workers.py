"""A DataLoader with two worker processes that run torch ops: workers must not record or write anything."""

import torch
from torch.utils.data import DataLoader, Dataset


class Squares(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, index):
        x = torch.full((4,), float(index)) / 64
        return x, (x * x).sum(dim=0, keepdim=True)


if __name__ == "__main__":
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(Squares(), batch_size=8, num_workers=2, shuffle=False)
    for epoch in range(3):
        for inputs, targets in loader:
            loss = torch.nn.functional.mse_loss(model(inputs), targets)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
