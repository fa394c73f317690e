"""MorvanZhou's PyTorch-Tutorial 406_GAN (an artist's sine curves), as in the report: D's step, then G's backward.

Source: https://github.com/pytorch/pytorch/issues/39141 ("I am using pytorch-1.5 to do some gan
test. My code is very simple gan code which just fit the sin(x) function ... RuntimeError: one of
the variables needed for gradient computation has been modified by an inplace operation"). `G_loss`
reuses `prob_artist1 = D(G_paintings)`, whose Linear layers saved D's weights; `opt_D.step()`
overwrites them before `G_loss.backward()`. The tutorial's later form (the intended program here)
trains G first, then D on `G_paintings.detach()`. Two steps, smaller layers.
"""
import numpy as np
import torch
import torch.nn as nn

torch.manual_seed(1)
np.random.seed(1)

# Hyper Parameters
BATCH_SIZE = 8
LR_G = 0.0001
LR_D = 0.0001
N_IDEAS = 5
ART_COMPONENTS = 15
PAINT_POINTS = np.vstack([np.linspace(-1, 1, ART_COMPONENTS) for _ in range(BATCH_SIZE)])


def artist_works():  # painting from the famous artist (real target)
    r = 0.02 * np.random.randn(1, ART_COMPONENTS)
    paintings = np.sin(PAINT_POINTS * np.pi) + r
    paintings = torch.from_numpy(paintings).float()
    return paintings


G = nn.Sequential(  # Generator
    nn.Linear(N_IDEAS, 16),
    nn.ReLU(),
    nn.Linear(16, ART_COMPONENTS),
)

D = nn.Sequential(  # Discriminator
    nn.Linear(ART_COMPONENTS, 16),
    nn.ReLU(),
    nn.Linear(16, 1),
    nn.Sigmoid(),
)

opt_D = torch.optim.Adam(D.parameters(), lr=LR_D)
opt_G = torch.optim.Adam(G.parameters(), lr=LR_G)

for _step in range(2):
    artist_paintings = artist_works()
    G_ideas = torch.randn(BATCH_SIZE, N_IDEAS, requires_grad=True)
    G_paintings = G(G_ideas)

    prob_artist0 = D(artist_paintings)
    prob_artist1 = D(G_paintings)  # <saved>

    D_loss = - torch.mean(torch.log(prob_artist0) + torch.log(1. - prob_artist1))
    G_loss = torch.mean(torch.log(1. - prob_artist1))

    opt_D.zero_grad()
    D_loss.backward(retain_graph=True)
    opt_D.step()  # <write>

    opt_G.zero_grad()
    G_loss.backward()  # <backward>
    opt_G.step()

result = {
    **{f"G.{n}": p.detach().clone() for n, p in G.named_parameters()},
    **{f"D.{n}": p.detach().clone() for n, p in D.named_parameters()},
}
