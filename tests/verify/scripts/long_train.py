"""Trains a tiny model for as many steps as it is given (argument 1, default 100000), slowly (0.2 s a step), so that a
test stops verify while it trains. `--orphan` first starts a process that outlives its parent in a session of its
own (a `setsid` grandchild whose parent has ended: not a descendant of the run any more); `--ranks` trains as a
rank of torch.distributed.run (gloo)."""

import subprocess
import sys
import time

import torch

if "--orphan" in sys.argv:
    sleeper = "import time; time.sleep(600)"
    starter = (f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {sleeper!r}, 'orphan-of', "
               "sys.argv[1]], start_new_session=True)")
    subprocess.run([sys.executable, "-c", starter, __file__], check=True)  # the starter ends at once
if "--ranks" in sys.argv:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo")
model = torch.nn.Linear(4, 1)
if "--ranks" in sys.argv:
    model = DistributedDataParallel(model)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
steps = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 100000
for _ in range(steps):
    optimizer.zero_grad()
    model(torch.randn(8, 4)).pow(2).mean().backward()
    optimizer.step()
    time.sleep(0.2)
print("trained to the end", flush=True)
