"""SinGAN's train_single_scale: Gsteps generator updates on the one `fake` made in the D loop.

Source: https://github.com/tamarott/SinGAN/issues/148 ("the second time we go through this loop,
the same fake image is used to calculate the loss (that is, the fake image that had been generated
with a previous set of netG weights)"), also #140 and PR #117, SinGAN/training.py. With PyTorch
>= 1.5 the second `errG.backward(retain_graph=True)` raises: `optimizerG.step()` overwrote the
generator weights the graph of `fake` saved. The intended program, as rgb000000 proposed in PR #117:
"create a new fake here" at the top of the generator loop.
"""
import torch
from torch import nn

torch.manual_seed(0)
netG = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.LeakyReLU(0.2), nn.Conv2d(8, 3, 3, padding=1), nn.Tanh())
netD = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.LeakyReLU(0.2), nn.Conv2d(8, 1, 3, padding=1))
optimizerD = torch.optim.Adam(netD.parameters(), lr=5e-4, betas=(0.5, 0.999))
optimizerG = torch.optim.Adam(netG.parameters(), lr=5e-4, betas=(0.5, 0.999))
real = torch.randn(1, 3, 8, 8)
Dsteps, Gsteps = 3, 3

for epoch in range(2):
    ############################
    # (1) Update D network: maximize D(x) + D(G(z))
    ###########################
    for j in range(Dsteps):
        netD.zero_grad()
        output = netD(real)
        errD_real = -output.mean()
        errD_real.backward(retain_graph=True)

        noise = torch.randn(1, 3, 8, 8)
        fake = netG(noise.detach())  # <saved>
        output = netD(fake.detach())
        errD_fake = output.mean()
        errD_fake.backward(retain_graph=True)
        optimizerD.step()

    ############################
    # (2) Update G network: maximize D(G(z))
    ###########################
    for j in range(Gsteps):
        netG.zero_grad()
        output = netD(fake)  # <regenerate-before>
        errG = -output.mean()
        errG.backward(retain_graph=True)  # <backward>
        optimizerG.step()  # <write>

result = {
    **{f"G.{n}": p.detach().clone() for n, p in netG.named_parameters()},
    **{f"D.{n}": p.detach().clone() for n, p in netD.named_parameters()},
}
