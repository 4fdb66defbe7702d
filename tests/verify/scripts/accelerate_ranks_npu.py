"""An accelerate training loop ported to the NPU (transfer mode), for `accelerate launch --num_processes 2
--mixed_precision fp16`: run by verify as `--nproc-per-node 2` with ACCELERATE_MIXED_PRECISION=fp16. It checks that
accelerate sees what its launcher would have given it, then trains."""

import torch
import torch_npu  # noqa: F401
from torch_npu.contrib import transfer_to_npu  # noqa: F401
from accelerate import Accelerator

accelerator = Accelerator()
assert (accelerator.distributed_type.name, accelerator.num_processes, accelerator.mixed_precision) == (
    "MULTI_NPU", 2, "fp16"), accelerator.state
with accelerator.main_process_first():
    generator = torch.Generator().manual_seed(0)
    inputs, targets = torch.randn(32, 4, generator=generator), torch.randn(32, 1, generator=generator)
    data = torch.utils.data.TensorDataset(inputs, targets)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer, loader = accelerator.prepare(model, optimizer, torch.utils.data.DataLoader(data, batch_size=4))
for inputs, targets in loader:
    optimizer.zero_grad()
    accelerator.backward(torch.nn.functional.mse_loss(model(inputs), targets))
    optimizer.step()
accelerator.wait_for_everyone()
