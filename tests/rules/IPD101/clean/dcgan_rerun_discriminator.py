"""pytorch/examples' DCGAN order: D steps, then D runs again on the fake batch for G's loss."""
import torch
from torch import nn


def main() -> None:
    torch.manual_seed(0)
    G = nn.Sequential(nn.Linear(2, 8), nn.ReLU(inplace=True), nn.Linear(8, 4))
    D = nn.Sequential(nn.Linear(4, 8), nn.LeakyReLU(0.2, inplace=True), nn.Linear(8, 1))
    opt_g = torch.optim.Adam(G.parameters(), lr=1e-3)
    opt_d = torch.optim.Adam(D.parameters(), lr=1e-3)
    bce = nn.BCEWithLogitsLoss()
    real = torch.randn(5, 4)
    for _ in range(2):
        fake = G(torch.randn(5, 2))
        opt_d.zero_grad()
        loss_d = bce(D(real), torch.ones(5, 1)) + bce(D(fake.detach()), torch.zeros(5, 1))
        loss_d.backward()
        opt_d.step()
        opt_g.zero_grad()
        loss_g = bce(D(fake), torch.ones(5, 1))
        loss_g.backward()
        opt_g.step()


main()
