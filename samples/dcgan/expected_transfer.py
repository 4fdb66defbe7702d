"""DCGAN: a convolutional generator and discriminator trained against each other (Radford et al., 2015).

    python train_gpu.py --dataset synthetic --niter 25 --ngpu 2 --outf runs/dcgan
"""
import argparse
import math
import os
import random

import torch
import torch_npu
from torch_npu.contrib import transfer_to_npu
import torch.backends.cudnn as cudnn
import torch.nn as nn
import torch.optim as optim
import torch.utils.data
from torch.utils.data import Dataset

parser = argparse.ArgumentParser()
parser.add_argument("--dataset", default="synthetic", choices=["synthetic", "folder"],
                    help="synthetic blobs, or a folder of 3xHxW uint8 tensors saved with torch.save")
parser.add_argument("--dataroot", default="", help="folder of image tensors (--dataset folder)")
parser.add_argument("--num-images", type=int, default=50000, help="size of the synthetic dataset")
parser.add_argument("--workers", type=int, default=2, help="data loading workers")
parser.add_argument("--batchSize", type=int, default=64, help="input batch size")
parser.add_argument("--imageSize", type=int, default=64, help="height and width of the images, a power of two >= 16")
parser.add_argument("--nz", type=int, default=100, help="size of the latent z vector")
parser.add_argument("--ngf", type=int, default=64, help="generator width")
parser.add_argument("--ndf", type=int, default=64, help="discriminator width")
parser.add_argument("--niter", type=int, default=25, help="number of epochs to train for")
parser.add_argument("--lr", type=float, default=0.0002, help="learning rate, default=0.0002")
parser.add_argument("--beta1", type=float, default=0.5, help="beta1 for adam. default=0.5")
parser.add_argument("--no-cuda", action="store_true", help="train on the CPU even if a GPU is present")
parser.add_argument("--dry-run", action="store_true", help="one batch per epoch, to check the setup")
parser.add_argument("--ngpu", type=int, default=1, help="number of GPUs to use")
parser.add_argument("--netG", default="", help="generator weights to start from")
parser.add_argument("--netD", default="", help="discriminator weights to start from")
parser.add_argument("--outf", default=".", help="folder for checkpoints and sample grids")
parser.add_argument("--manualSeed", type=int, help="manual seed")

opt = parser.parse_args()
print(opt)

os.makedirs(opt.outf, exist_ok=True)

if opt.manualSeed is None:
    opt.manualSeed = random.randint(1, 10000)
print("Random Seed: ", opt.manualSeed)
random.seed(opt.manualSeed)
torch.manual_seed(opt.manualSeed)

cudnn.benchmark = True

use_cuda = not opt.no_cuda and torch.cuda.is_available()
if torch.cuda.is_available() and not use_cuda:
    print("WARNING: a CUDA device is available; drop --no-cuda to use it")
device = torch.device("cuda:0" if use_cuda else "cpu")
ngpu = int(opt.ngpu)
nz, ngf, ndf, nc = opt.nz, opt.ngf, opt.ndf, 3


class SyntheticBlobs(Dataset):
    """Coloured Gaussian blobs on a dark background, in [-1, 1]: a distribution a small GAN learns in minutes."""

    def __init__(self, size, image_size):
        self.size, self.image_size = size, image_size
        grid = torch.linspace(-1, 1, image_size)
        self.ys, self.xs = torch.meshgrid(grid, grid, indexing="ij")

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        generator = torch.Generator().manual_seed(index)
        centre = torch.rand(2, generator=generator) * 1.2 - 0.6
        radius = 0.2 + 0.3 * torch.rand(1, generator=generator)
        colour = torch.rand(3, 1, 1, generator=generator)
        blob = torch.exp(-((self.xs - centre[0]) ** 2 + (self.ys - centre[1]) ** 2) / radius**2)
        return colour * blob * 2 - 1, 0


class TensorImages(Dataset):
    def __init__(self, root, image_size):
        self.paths = sorted(os.path.join(root, name) for name in os.listdir(root) if name.endswith(".pt"))
        self.image_size = image_size

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, index):
        image = torch.load(self.paths[index], weights_only=True).float().div(127.5).sub(1)
        return nn.functional.interpolate(image[None], size=self.image_size, mode="bilinear")[0], 0


if opt.dataset == "synthetic":
    dataset = SyntheticBlobs(opt.num_images, opt.imageSize)
else:
    dataset = TensorImages(opt.dataroot, opt.imageSize)
dataloader = torch.utils.data.DataLoader(dataset, batch_size=opt.batchSize, shuffle=True,
                                         num_workers=int(opt.workers))


def weights_init(m):
    """DCGAN initialisation: N(0, 0.02) for convolutions, N(1, 0.02) for the BatchNorm gains."""
    classname = m.__class__.__name__
    if "Conv" in classname:
        nn.init.normal_(m.weight, 0.0, 0.02)
    elif "BatchNorm" in classname:
        nn.init.normal_(m.weight, 1.0, 0.02)
        nn.init.zeros_(m.bias)


def doublings(image_size):
    """Number of stride-2 layers between a 4x4 feature map and the image."""
    steps = int(math.log2(image_size)) - 2
    assert 2 ** (steps + 2) == image_size and steps >= 2, "imageSize must be a power of two >= 16"
    return steps


class Generator(nn.Module):
    def __init__(self, ngpu, image_size):
        super().__init__()
        self.ngpu = ngpu
        steps = doublings(image_size)
        width = ngf * 2 ** (steps - 1)
        # z (nz x 1 x 1) -> width x 4 x 4, then halve the channels and double the side until the image size
        layers = [nn.ConvTranspose2d(nz, width, 4, 1, 0, bias=False), nn.BatchNorm2d(width), nn.ReLU(True)]
        for _ in range(steps - 1):
            layers += [nn.ConvTranspose2d(width, width // 2, 4, 2, 1, bias=False), nn.BatchNorm2d(width // 2),
                       nn.ReLU(True)]
            width //= 2
        layers += [nn.ConvTranspose2d(width, nc, 4, 2, 1, bias=False), nn.Tanh()]
        self.main = nn.Sequential(*layers)

    def forward(self, input):
        if input.is_cuda and self.ngpu > 1:
            return nn.parallel.data_parallel(self.main, input, range(self.ngpu))
        return self.main(input)


class Discriminator(nn.Module):
    def __init__(self, ngpu, image_size):
        super().__init__()
        self.ngpu = ngpu
        steps = doublings(image_size)
        # image -> ndf x side/2 (no BatchNorm on the input layer), then double the channels and halve the side
        layers = [nn.Conv2d(nc, ndf, 4, 2, 1, bias=False), nn.LeakyReLU(0.2, inplace=True)]
        width = ndf
        for _ in range(steps - 1):
            layers += [nn.Conv2d(width, width * 2, 4, 2, 1, bias=False), nn.BatchNorm2d(width * 2),
                       nn.LeakyReLU(0.2, inplace=True)]
            width *= 2
        layers += [nn.Conv2d(width, 1, 4, 1, 0, bias=False), nn.Sigmoid()]
        self.main = nn.Sequential(*layers)

    def forward(self, input):
        if input.is_cuda and self.ngpu > 1:
            output = nn.parallel.data_parallel(self.main, input, range(self.ngpu))
        else:
            output = self.main(input)
        return output.view(-1, 1).squeeze(1)


netG = Generator(ngpu, opt.imageSize).to(device)
netG.apply(weights_init)
if opt.netG != "":
    netG.load_state_dict(torch.load(opt.netG, map_location=device, weights_only=True))
print(netG)

netD = Discriminator(ngpu, opt.imageSize).to(device)
netD.apply(weights_init)
if opt.netD != "":
    netD.load_state_dict(torch.load(opt.netD, map_location=device, weights_only=True))
print(netD)

criterion = nn.BCELoss()

fixed_noise = torch.randn(opt.batchSize, nz, 1, 1, device=device)
real_label = 1.0
fake_label = 0.0

optimizerD = optim.Adam(netD.parameters(), lr=opt.lr, betas=(opt.beta1, 0.999))
optimizerG = optim.Adam(netG.parameters(), lr=opt.lr, betas=(opt.beta1, 0.999))
scaler = torch.amp.GradScaler("npu")

for epoch in range(opt.niter):
    for i, data in enumerate(dataloader, 0):
        # (1) Discriminator: maximize log(D(x)) + log(1 - D(G(z)))
        netD.zero_grad()
        real = data[0].to(device)
        batch_size = real.size(0)
        label = torch.full((batch_size,), real_label, dtype=real.dtype, device=device)

        with torch.autocast(device_type="npu", dtype=torch.float16):
            output = netD(real)
        errD_real = criterion(output.float(), label.float())
        scaler.scale(errD_real).backward()
        D_x = output.mean().item()

        noise = torch.randn(batch_size, nz, 1, 1, device=device)
        with torch.autocast(device_type="npu", dtype=torch.float16):
            fake = netG(noise)
            label.fill_(fake_label)
            # detach: this backward must not reach the generator
            output = netD(fake.detach())
        errD_fake = criterion(output.float(), label.float())
        scaler.scale(errD_fake).backward()
        D_G_z1 = output.mean().item()
        errD = errD_real + errD_fake
        scaler.step(optimizerD)

        # (2) Generator: maximize log(D(G(z))), the non-saturating form of minimizing log(1 - D(G(z)))
        netG.zero_grad()
        label.fill_(real_label)  # fake images are "real" for the generator's loss
        with torch.autocast(device_type="npu", dtype=torch.float16):
            output = netD(fake)
        errG = criterion(output.float(), label.float())
        scaler.scale(errG).backward()
        D_G_z2 = output.mean().item()
        scaler.step(optimizerG)
        scaler.update()

        print("[%d/%d][%d/%d] Loss_D: %.4f Loss_G: %.4f D(x): %.4f D(G(z)): %.4f / %.4f"
              % (epoch, opt.niter, i, len(dataloader), errD.item(), errG.item(), D_x, D_G_z1, D_G_z2))
        if i % 100 == 0:
            with torch.no_grad():
                samples = netG(fixed_noise).detach().cpu()
            torch.save(samples, "%s/fake_samples_epoch_%03d.pt" % (opt.outf, epoch))

        if opt.dry_run:
            break
    # checkpoint after every epoch
    torch.save(netG.state_dict(), "%s/netG_epoch_%d.pth" % (opt.outf, epoch))
    torch.save(netD.state_dict(), "%s/netD_epoch_%d.pth" % (opt.outf, epoch))
