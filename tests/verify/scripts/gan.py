"""Two optimizers per iteration (a GAN): a step is counted once per iteration, on the discriminator's optimizer,
which steps first."""

import torch
import torch.nn as nn

generator = nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 4))
discriminator = nn.Sequential(nn.Linear(4, 8), nn.LeakyReLU(0.2), nn.Linear(8, 1))
optimizer_d = torch.optim.Adam(discriminator.parameters(), lr=1e-3, betas=(0.5, 0.999))
optimizer_g = torch.optim.Adam(generator.parameters(), lr=2e-3, betas=(0.5, 0.999))
criterion = nn.BCEWithLogitsLoss()
for _ in range(10):
    real, noise = torch.randn(16, 4) + 2, torch.randn(16, 2)
    fake = generator(noise)
    loss_real = criterion(discriminator(real), torch.ones(16, 1))
    loss_d = loss_real + criterion(discriminator(fake.detach()), torch.zeros(16, 1))
    optimizer_d.zero_grad()
    loss_d.backward()
    optimizer_d.step()
    loss_g = criterion(discriminator(fake), torch.ones(16, 1))
    optimizer_g.zero_grad()
    loss_g.backward()
    optimizer_g.step()
