"""A script that prepares its data the first time it runs, as torchvision's datasets download theirs (the file
written chunk by chunk where it will lie, then read), and saves a checkpoint every step that it reads back (the
newest model, as a script evaluating its best checkpoint does)."""

import argparse
import os
import time

import numpy as np
import torch
import torch.nn as nn

parser = argparse.ArgumentParser()
parser.add_argument("--folder", required=True)
args = parser.parse_args()

data = os.path.join(args.folder, "data.bin")
if os.path.exists(data):
    print("data found")
else:
    os.makedirs(args.folder, exist_ok=True)
    with open(data, "wb") as file:
        for chunk in np.split(np.linspace(-1, 1, 64 * 4, dtype=np.float32), 16):
            file.write(chunk.tobytes())
            file.flush()
            time.sleep(0.05)  # a download's pace: a run reading the file now would read part of it
    print("data downloaded")
inputs = torch.from_numpy(np.fromfile(data, dtype=np.float32)).reshape(64, 4)

model = nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
checkpoint = os.path.join(args.folder, "model.pt")
for batch in inputs.split(8):
    optimizer.zero_grad()
    loss = model(batch).pow(2).mean()
    loss.backward()
    optimizer.step()
    torch.save({"model": model.state_dict(), "padding": torch.zeros(1 << 16)}, checkpoint)
    torch.load(checkpoint)
