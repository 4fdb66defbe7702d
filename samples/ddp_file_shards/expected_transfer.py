"""Distributed training over a dataset stored as many shard files, launched with torchrun.

    torchrun --nproc_per_node=8 train_gpu.py --epochs 10
    python train_gpu.py --epochs 1          # one process, no launcher

Rank 0 first writes the dataset (synthetic feature/label shards, .npz) under --data-dir, or a temporary folder.
"""
import argparse
import glob
import os
import tempfile

import numpy as np
import torch
import torch_npu
from torch_npu.contrib import transfer_to_npu
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import ConcatDataset, DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

NUM_FEATURES, NUM_CLASSES = 64, 10


def write_shards(root, split, num_shards, rows_per_shard, seed):
    """Gaussian clusters, one per class; each shard file holds `rows_per_shard` rows of every class mixed."""
    rng = np.random.default_rng(seed)
    centres = np.random.default_rng(0).normal(scale=2.0, size=(NUM_CLASSES, NUM_FEATURES))
    os.makedirs(os.path.join(root, split), exist_ok=True)
    for shard in range(num_shards):
        labels = rng.integers(NUM_CLASSES, size=rows_per_shard)
        features = centres[labels] + rng.normal(size=(rows_per_shard, NUM_FEATURES))
        path = os.path.join(root, split, f"shard-{shard:05d}.npz")
        np.savez(path, features=features.astype(np.float32), labels=labels.astype(np.int64))


class ShardFile(Dataset):
    def __init__(self, path):
        with np.load(path) as shard:
            self.features = torch.from_numpy(shard["features"])
            self.labels = torch.from_numpy(shard["labels"])

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, index):
        return self.features[index], self.labels[index]


class Classifier(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(NUM_FEATURES, hidden), nn.BatchNorm1d(hidden), nn.ReLU(),
            nn.Linear(hidden, hidden), nn.BatchNorm1d(hidden), nn.ReLU(),
            nn.Linear(hidden, NUM_CLASSES),
        )

    def forward(self, x):
        return self.net(x)


def setup():
    """(rank, local_rank, world_size, device); joins the process group when started by torchrun."""
    rank = int(os.environ.get("RANK", 0))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    if "RANK" in os.environ:
        dist.init_process_group(backend="hccl" if device.type == "cuda" else "gloo")
    return rank, local_rank, world_size, device


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data-dir", default=None, help="where the shards go (default: a new temporary folder)")
    parser.add_argument("--train-shards", type=int, default=64)
    parser.add_argument("--val-shards", type=int, default=8)
    parser.add_argument("--rows-per-shard", type=int, default=2048)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=128, help="per process")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args()

    rank, local_rank, world_size, device = setup()
    distributed = dist.is_initialized()

    # Rank 0 writes the data, the others wait at the barrier; the folder name comes from rank 0 too.
    data_dir = [args.data_dir or (tempfile.mkdtemp(prefix="shards-") if rank == 0 else None)]
    if distributed:
        os.environ.setdefault("TORCH_NPU_DEVICE_CAPABILITY", "8.0")  # read by torch.distributed.broadcast
        dist.broadcast_object_list(data_dir, src=0)
    data_dir = data_dir[0]
    if rank == 0:
        write_shards(data_dir, "train", args.train_shards, args.rows_per_shard, seed=1)
        write_shards(data_dir, "val", args.val_shards, args.rows_per_shard, seed=2)
    if distributed:
        dist.barrier()

    # Every rank reads all training shards; the sampler splits the rows between ranks.
    train_files = sorted(glob.glob(os.path.join(data_dir, "train", "*.npz")))
    train_set = ConcatDataset([ShardFile(path) for path in train_files])
    train_sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank, shuffle=True)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=train_sampler,
                              num_workers=args.workers, pin_memory=True, drop_last=True)

    # Validation shards are split by file: each rank scores its own files, the totals are summed across ranks.
    val_files = [os.path.join(data_dir, "val", name)
                 for name in sorted(os.listdir(os.path.join(data_dir, "val")))]
    my_val_files = val_files[rank::world_size]
    val_loader = DataLoader(ConcatDataset([ShardFile(path) for path in my_val_files]), batch_size=1024)

    model = Classifier(args.hidden).to(device)
    if distributed and device.type == "cuda":
        # batch statistics over the global batch (SyncBatchNorm runs on GPUs only)
        model = DDP(nn.SyncBatchNorm.convert_sync_batchnorm(model), device_ids=[local_rank])
    elif distributed:
        model = DDP(model)
    # linear scaling rule: the learning rate grows with the global batch
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * world_size, momentum=0.9, nesterov=True)
    scaler = torch.amp.GradScaler("npu")
    criterion = nn.CrossEntropyLoss()

    for epoch in range(args.epochs):
        train_sampler.set_epoch(epoch)
        model.train()
        for step, (features, labels) in enumerate(train_loader):
            features, labels = features.to(device, non_blocking=True), labels.to(device, non_blocking=True)
            with torch.autocast(device_type="npu", dtype=torch.float16):
                loss = criterion(model(features), labels)
            optimizer.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            if rank == 0 and step % 50 == 0:
                print(f"epoch {epoch} step {step}/{len(train_loader)} loss {loss.item():.4f}")

        model.eval()
        totals = torch.zeros(3, device=device)  # loss sum, correct, rows
        with torch.no_grad():
            for features, labels in val_loader:
                features, labels = features.to(device), labels.to(device)
                logits = model(features)
                totals += torch.stack([
                    nn.functional.cross_entropy(logits, labels, reduction="sum"),
                    (logits.argmax(1) == labels).sum().float(),
                    torch.tensor(float(len(labels)), device=device),
                ])
        if distributed:
            dist.all_reduce(totals)
        if rank == 0:
            loss_sum, correct, rows = totals.tolist()
            print(f"epoch {epoch} val loss {loss_sum / rows:.4f} acc {correct / rows:.2%}")

    if rank == 0:
        state = model.module.state_dict() if distributed else model.state_dict()
        torch.save(state, os.path.join(data_dir, "classifier.pt"))
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
