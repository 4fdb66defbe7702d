"""Written for a launcher, as pytorch/examples distributed/ddp-tutorial-series/multigpu_torchrun.py is: it reads the
variables torchrun sets before anything else, so without torchrun it stops before its first step."""

import os

import torch

local_rank = int(os.environ["LOCAL_RANK"])
model = torch.nn.Linear(4, 2).to(local_rank)
