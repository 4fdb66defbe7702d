"""A dataset of files read in the order its folder lists them (os.listdir, unsorted: pytorch/examples'
super_resolution does so): the file system's order, which `migrate`'s port sorts."""

import argparse
import os

import torch
import torch.nn as nn

parser = argparse.ArgumentParser()
parser.add_argument("--folder", required=True)
args = parser.parse_args()

os.makedirs(args.folder, exist_ok=True)
for index, name in enumerate("kcxaqmzbte"):  # created out of name order, each file its own sample
    torch.save(torch.full((4,), float(index)), os.path.join(args.folder, f"{name}.pt"))


class Files(torch.utils.data.Dataset):
    def __init__(self, folder):
        self.paths = [os.path.join(folder, name) for name in os.listdir(folder)]

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, index):
        return torch.load(self.paths[index])


model = nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for batch in torch.utils.data.DataLoader(Files(args.folder), batch_size=2):
    optimizer.zero_grad()
    loss = model(batch).pow(2).mean()
    loss.backward()
    optimizer.step()
