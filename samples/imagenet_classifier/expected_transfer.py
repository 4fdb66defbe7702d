"""Train an ImageNet-style image classifier, on one GPU, with DataParallel, or with DDP over several nodes.

    python train_gpu.py --dummy -a resnet18                      # synthetic data, all visible GPUs (DataParallel)
    python train_gpu.py --dummy --gpu 0                          # one GPU
    python train_gpu.py DATA --multiprocessing-distributed --world-size 1 --rank 0 --dist-url tcp://127.0.0.1:23456

DATA is a folder of class-sorted image tensors (`<split>/<class>/<n>.pt`, each a 3xHxW uint8 tensor).
"""
import argparse
import os
import random
import shutil
import time
import warnings
from enum import Enum

import torch
import torch_npu
from torch_npu.contrib import transfer_to_npu
import torch.backends.cudnn as cudnn
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.parallel
import torch.optim
import torch.utils.data
import torch.utils.data.distributed
from torch.optim.lr_scheduler import StepLR
from torch.utils.data import Dataset, Subset

# AMP101 mixed precision: one loss scaler, shared by every training function
scaler = torch.amp.GradScaler("npu")

# ----------------------------------------------------------------------------------------------------------------
# Model: a ResNet written out in plain torch (torchvision is not a dependency of this script)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, in_planes, planes, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or in_planes != planes:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False),
                nn.BatchNorm2d(planes),
            )

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNet(nn.Module):
    def __init__(self, blocks_per_stage, num_classes=1000, width=64):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, width, 7, stride=2, padding=3, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(3, stride=2, padding=1),
        )
        stages, in_planes = [], width
        for index, blocks in enumerate(blocks_per_stage):
            planes = width * 2**index
            stride = 1 if index == 0 else 2
            layers = [BasicBlock(in_planes, planes, stride)]
            layers += [BasicBlock(planes, planes) for _ in range(blocks - 1)]
            stages.append(nn.Sequential(*layers))
            in_planes = planes
        self.layers = nn.Sequential(*stages)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(in_planes, num_classes)

        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, x):
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(self.avgpool(x), 1))


ARCHITECTURES = {
    "resnet10": [1, 1, 1, 1],
    "resnet18": [2, 2, 2, 2],
    "resnet34": [3, 4, 6, 3],
}

# ----------------------------------------------------------------------------------------------------------------
# Data


class SyntheticImages(Dataset):
    """Random normalised images with random labels, like torchvision's FakeData: for benchmarks and smoke tests.

    Each item is generated from its index, so every epoch (and every rank) sees the same image for the same index.
    """

    def __init__(self, size, image_size=224, num_classes=1000, offset=0):
        self.size, self.image_size, self.num_classes, self.offset = size, image_size, num_classes, offset

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        generator = torch.Generator().manual_seed(self.offset + index)
        image = torch.randn(3, self.image_size, self.image_size, generator=generator)
        target = int(torch.randint(self.num_classes, (1,), generator=generator))
        return image, target


class TensorFolder(Dataset):
    """`root/<class>/<n>.pt` files, each a 3xHxW uint8 image tensor; classes are the sorted folder names."""

    MEAN = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
    STD = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)

    def __init__(self, root):
        self.classes = sorted(entry.name for entry in os.scandir(root) if entry.is_dir())
        self.samples = [
            (os.path.join(root, name, file), label)
            for label, name in enumerate(self.classes)
            for file in sorted(os.listdir(os.path.join(root, name)))
        ]

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, index):
        path, target = self.samples[index]
        image = torch.load(path, weights_only=True).float() / 255
        return (image - self.MEAN) / self.STD, target


# ----------------------------------------------------------------------------------------------------------------

parser = argparse.ArgumentParser(description="Image classification training (ImageNet layout)")
parser.add_argument("data", metavar="DIR", nargs="?", default="imagenet", help="dataset root with train/ and val/")
parser.add_argument("-a", "--arch", metavar="ARCH", default="resnet18", choices=sorted(ARCHITECTURES),
                    help="one of " + ", ".join(sorted(ARCHITECTURES)))
parser.add_argument("-j", "--workers", default=4, type=int, metavar="N", help="data loader processes per GPU")
parser.add_argument("--epochs", default=90, type=int, metavar="N", help="epochs to train for")
parser.add_argument("--start-epoch", default=0, type=int, metavar="N", help="first epoch (set by --resume)")
parser.add_argument("-b", "--batch-size", default=256, type=int, metavar="N",
                    help="batch size of the whole node; split between the GPUs under DataParallel or DDP")
parser.add_argument("--lr", "--learning-rate", default=0.1, type=float, metavar="LR", dest="lr",
                    help="learning rate at epoch 0")
parser.add_argument("--momentum", default=0.9, type=float, metavar="M", help="SGD momentum")
parser.add_argument("--wd", "--weight-decay", default=1e-4, type=float, metavar="W", dest="weight_decay",
                    help="L2 penalty")
parser.add_argument("-p", "--print-freq", default=10, type=int, metavar="N", help="log every N batches")
parser.add_argument("--resume", default="", type=str, metavar="PATH", help="checkpoint to continue from")
parser.add_argument("-e", "--evaluate", dest="evaluate", action="store_true", help="only run the validation pass")
parser.add_argument("--image-size", default=224, type=int, help="side of the square input images")
parser.add_argument("--world-size", default=-1, type=int, help="number of nodes")
parser.add_argument("--rank", default=-1, type=int, help="rank of this node")
parser.add_argument("--dist-url", default="tcp://224.66.41.62:23456", type=str, help="rendezvous address")
parser.add_argument("--dist-backend", default="hccl", type=str, help="torch.distributed backend")
parser.add_argument("--seed", default=None, type=int, help="seed everything (slower: deterministic kernels)")
parser.add_argument("--gpu", default=None, type=int, help="train on this GPU only")
parser.add_argument("--multiprocessing-distributed", action="store_true",
                    help="spawn one DDP process per GPU of this node (the fastest setup, one node or many)")
parser.add_argument("--dummy", action="store_true", help="train on synthetic images (benchmarks, smoke tests)")
parser.add_argument("--dummy-train-size", default=1281167, type=int, help="synthetic training images")
parser.add_argument("--dummy-val-size", default=50000, type=int, help="synthetic validation images")

best_acc1 = 0


def main():
    args = parser.parse_args()

    if args.seed is not None:
        random.seed(args.seed)
        torch.manual_seed(args.seed)
        # Reproducible convolutions: cudnn may no longer pick its fastest (nondeterministic) algorithms.
        cudnn.deterministic = True
        torch.use_deterministic_algorithms(True, warn_only=True)
        cudnn.benchmark = False
        warnings.warn("Seeded run: cudnn is deterministic now, expect slower training.")

    if args.gpu is not None:
        warnings.warn(f"Training on GPU {args.gpu} only: DataParallel is off.")

    if args.dist_url == "env://" and args.world_size == -1:
        args.world_size = int(os.environ["WORLD_SIZE"])

    args.distributed = args.world_size > 1 or args.multiprocessing_distributed

    if torch.cuda.is_available():
        ngpus_per_node = torch.cuda.device_count()
        if ngpus_per_node == 1 and args.dist_backend == "hccl":
            warnings.warn("A single GPU with the nccl backend: consider --dist-backend gloo")
    else:
        ngpus_per_node = 1

    if args.multiprocessing_distributed:
        # One process per GPU on this node: the world size becomes the total number of processes.
        args.world_size = ngpus_per_node * args.world_size
        mp.spawn(main_worker, nprocs=ngpus_per_node, args=(ngpus_per_node, args))
    else:
        main_worker(args.gpu, ngpus_per_node, args)


def main_worker(gpu, ngpus_per_node, args):
    global best_acc1
    args.gpu = gpu

    if args.gpu is not None:
        print(f"Use GPU: {args.gpu} for training")

    if args.distributed:
        if args.dist_url == "env://" and args.rank == -1:
            args.rank = int(os.environ["RANK"])
        if args.multiprocessing_distributed:
            # The global rank of this process among all processes of all nodes.
            args.rank = args.rank * ngpus_per_node + gpu
        dist.init_process_group(backend=args.dist_backend, init_method=args.dist_url,
                                world_size=args.world_size, rank=args.rank)

    print(f"=> creating model '{args.arch}'")
    model = ResNet(ARCHITECTURES[args.arch])

    if not torch.cuda.is_available():
        print("using CPU, this will be slow")
    elif args.distributed:
        # With one process per GPU, each DDP instance gets one device and a share of the batch and the workers.
        if args.gpu is not None:
            torch.cuda.set_device(args.gpu)
            model.cuda(args.gpu)
            args.batch_size = int(args.batch_size / ngpus_per_node)
            args.workers = int((args.workers + ngpus_per_node - 1) / ngpus_per_node)
            model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[args.gpu])
        else:
            model.cuda()
            # Without device_ids, DDP spreads the batch over all visible GPUs.
            model = torch.nn.parallel.DistributedDataParallel(model)
    elif args.gpu is not None:
        torch.cuda.set_device(args.gpu)
        model = model.cuda(args.gpu)
    else:
        # DataParallel splits the batch across all available GPUs
        model = torch.nn.DataParallel(model).cuda()

    if not torch.cuda.is_available():
        device = torch.device("cpu")
    elif args.gpu is not None:
        device = torch.device("cuda:{}".format(args.gpu))
    else:
        device = torch.device("cuda")

    criterion = nn.CrossEntropyLoss().to(device)
    optimizer = torch.optim.SGD(model.parameters(), args.lr, momentum=args.momentum, weight_decay=args.weight_decay)
    # Decay the learning rate by 10 every 30 epochs.
    scheduler = StepLR(optimizer, step_size=30, gamma=0.1)

    if args.resume:
        if os.path.isfile(args.resume):
            print(f"=> loading checkpoint '{args.resume}'")
            # Load onto this process's device, whatever device the checkpoint was saved from.
            checkpoint = torch.load(args.resume, map_location=device, weights_only=True)
            args.start_epoch = checkpoint["epoch"]
            best_acc1 = checkpoint["best_acc1"]
            model.load_state_dict(checkpoint["state_dict"])
            optimizer.load_state_dict(checkpoint["optimizer"])
            if "scaler" in checkpoint:  # older checkpoints have no scaler state
                scaler.load_state_dict(checkpoint["scaler"])
            scheduler.load_state_dict(checkpoint["scheduler"])
            print(f"=> loaded checkpoint '{args.resume}' (epoch {checkpoint['epoch']})")
        else:
            print(f"=> no checkpoint found at '{args.resume}'")

    # The input size never changes, so let cudnn pick the fastest convolution algorithms.
    cudnn.benchmark = True

    if args.dummy:
        print("=> Dummy data is used!")
        train_dataset = SyntheticImages(args.dummy_train_size, args.image_size)
        val_dataset = SyntheticImages(args.dummy_val_size, args.image_size, offset=args.dummy_train_size)
    else:
        train_dataset = TensorFolder(os.path.join(args.data, "train"))
        val_dataset = TensorFolder(os.path.join(args.data, "val"))

    if args.distributed:
        train_sampler = torch.utils.data.distributed.DistributedSampler(train_dataset)
        val_sampler = torch.utils.data.distributed.DistributedSampler(val_dataset, shuffle=False, drop_last=True)
    else:
        train_sampler = None
        val_sampler = None

    train_loader = torch.utils.data.DataLoader(
        train_dataset, batch_size=args.batch_size, shuffle=(train_sampler is None),
        num_workers=args.workers, pin_memory=True, sampler=train_sampler)

    val_loader = torch.utils.data.DataLoader(
        val_dataset, batch_size=args.batch_size, shuffle=False,
        num_workers=args.workers, pin_memory=True, sampler=val_sampler)

    if args.evaluate:
        validate(val_loader, model, criterion, args)
        return

    for epoch in range(args.start_epoch, args.epochs):
        if args.distributed:
            train_sampler.set_epoch(epoch)

        train(train_loader, model, criterion, optimizer, epoch, device, args)
        acc1 = validate(val_loader, model, criterion, args)
        scheduler.step()

        is_best = acc1 > best_acc1
        best_acc1 = max(acc1, best_acc1)

        if not args.multiprocessing_distributed or (args.multiprocessing_distributed
                                                    and args.rank % ngpus_per_node == 0):
            save_checkpoint({
                "epoch": epoch + 1,
                "arch": args.arch,
                "state_dict": model.state_dict(),
                "best_acc1": best_acc1,
                "optimizer": optimizer.state_dict(),
                "scaler": scaler.state_dict(),
                "scheduler": scheduler.state_dict(),
            }, is_best)


def train(train_loader, model, criterion, optimizer, epoch, device, args):
    batch_time = AverageMeter("Time", ":6.3f")
    data_time = AverageMeter("Data", ":6.3f")
    losses = AverageMeter("Loss", ":.4e")
    top1 = AverageMeter("Acc@1", ":6.2f")
    top5 = AverageMeter("Acc@5", ":6.2f")
    progress = ProgressMeter(len(train_loader), [batch_time, data_time, losses, top1, top5],
                             prefix="Epoch: [{}]".format(epoch))

    model.train()

    end = time.time()
    for i, (images, target) in enumerate(train_loader):
        data_time.update(time.time() - end)

        images = images.to(device, non_blocking=True)
        target = target.to(device, non_blocking=True)

        with torch.autocast(device_type="npu", dtype=torch.float16):
            output = model(images)
            loss = criterion(output, target)

        acc1, acc5 = accuracy(output, target, topk=(1, 5))
        losses.update(loss.item(), images.size(0))
        top1.update(acc1[0], images.size(0))
        top5.update(acc5[0], images.size(0))

        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()

        batch_time.update(time.time() - end)
        end = time.time()

        if i % args.print_freq == 0:
            progress.display(i + 1)


def validate(val_loader, model, criterion, args):
    batch_time = AverageMeter("Time", ":6.3f", Summary.NONE)
    losses = AverageMeter("Loss", ":.4e", Summary.NONE)
    top1 = AverageMeter("Acc@1", ":6.2f", Summary.AVERAGE)
    top5 = AverageMeter("Acc@5", ":6.2f", Summary.AVERAGE)
    progress = ProgressMeter(len(val_loader), [batch_time, losses, top1, top5], prefix="Test: ")

    model.eval()

    with torch.no_grad():
        end = time.time()
        for i, (images, target) in enumerate(val_loader):
            if args.gpu is not None and torch.cuda.is_available():
                images = images.cuda(args.gpu, non_blocking=True)
            if torch.cuda.is_available():
                target = target.cuda(args.gpu, non_blocking=True)

            output = model(images)
            loss = criterion(output, target)

            acc1, acc5 = accuracy(output, target, topk=(1, 5))
            losses.update(loss.item(), images.size(0))
            top1.update(acc1[0], images.size(0))
            top5.update(acc5[0], images.size(0))

            batch_time.update(time.time() - end)
            end = time.time()

            if i % args.print_freq == 0:
                progress.display(i + 1)

    if args.distributed:
        top1.all_reduce()
        top5.all_reduce()

    progress.display_summary()

    return top1.avg


def save_checkpoint(state, is_best, filename="checkpoint.pth.tar"):
    torch.save(state, filename)
    if is_best:
        shutil.copyfile(filename, "model_best.pth.tar")


class Summary(Enum):
    """Which statistic of a meter the end-of-validation line shows."""

    NONE = "none"
    AVERAGE = "avg"
    SUM = "sum"
    COUNT = "count"


class AverageMeter:
    """The latest value of a metric and its running, sample-weighted mean."""

    def __init__(self, name, fmt=":f", summary_type=Summary.AVERAGE):
        self.name, self.fmt, self.summary_type = name, fmt, summary_type
        self.val = self.sum = self.count = self.avg = 0

    def update(self, val, n=1):
        self.val = val
        self.sum += val * n
        self.count += n
        self.avg = self.sum / self.count

    def all_reduce(self):
        """Turn this rank's sums into the sums over all ranks (validation metrics of the whole dataset)."""
        device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
        totals = torch.tensor([float(self.sum), float(self.count)], device=device)
        dist.all_reduce(totals, dist.ReduceOp.SUM)
        self.sum, self.count = totals.tolist()
        self.avg = self.sum / self.count

    def __str__(self):
        return ("{} {:" + self.fmt[1:] + "} ({:" + self.fmt[1:] + "})").format(self.name, self.val, self.avg)

    def summary(self):
        if self.summary_type is Summary.NONE:
            return ""
        return "{} {:.3f}".format(self.name, getattr(self, self.summary_type.value))


class ProgressMeter:
    """Prints `prefix[batch/total]` followed by every meter, one line per call."""

    def __init__(self, num_batches, meters, prefix=""):
        width = len(str(num_batches))
        self.position = "[{:" + str(width) + "d}/" + str(num_batches) + "]"
        self.meters, self.prefix = meters, prefix

    def display(self, batch):
        print("\t".join([self.prefix + self.position.format(batch)] + [str(meter) for meter in self.meters]))

    def display_summary(self):
        print(" ".join([" *"] + [meter.summary() for meter in self.meters if meter.summary()]))


def accuracy(output, target, topk=(1,)):
    """Percentage of samples whose target is among the k highest logits, for each k in topk."""
    with torch.no_grad():
        ranked = output.topk(max(topk), dim=1).indices
        hits = ranked == target.unsqueeze(1)
        return [hits[:, :k].any(dim=1).float().mean(0, keepdim=True) * 100 for k in topk]


if __name__ == "__main__":
    main()
