"""deepspeed_train.py as `migrate` ports it.

A tiny DeepSpeed training written for the `deepspeed` launcher on GPUs: it requires the --local_rank the launcher
passes, sets its device from it, starts nccl through deepspeed.init_distributed, and trains with the engine (its
backward and step) as ds_config.json beside it says: ZeRO's stage, fp16 or fp32, its optimizer and loss scaling.
Every rank draws its own batches from its own seed."""

import argparse
from pathlib import Path

import deepspeed
import torch
import torch_npu
from torch_npu.contrib import transfer_to_npu
import random


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, required=True)
    args = parser.parse_args()
    torch.cuda.set_device(args.local_rank)
    deepspeed.init_distributed(dist_backend="hccl")
    torch.manual_seed(0)
    random.seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=str(Path(__file__).with_name("ds_config.json")))
    generator = torch.Generator().manual_seed(args.local_rank)
    for _ in range(20):
        inputs = torch.randn(8, 16, generator=generator).to(engine.device)
        labels = torch.randint(0, 4, (8,), generator=generator).to(engine.device)
        loss = torch.nn.functional.cross_entropy(engine(inputs.half() if engine.fp16_enabled() else inputs), labels)
        engine.backward(loss)
        engine.step()


if __name__ == "__main__":
    main()
