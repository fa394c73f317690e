"""pytorch/examples' VAE (vae/main.py, 2018): `std = logvar.mul(0.5).exp_()`, `eps.mul(std).add_(mu)`.

Source: https://github.com/pytorch/examples/issues/308 ("Is there a particular reason why the
method .exp_() is preferred to .exp()?"). A correct program: `exp_` writes the fresh output of
`mul(0.5)` (which saves nothing of it) and `add_` the fresh output of `eps.mul(std)`; ExpBackward0
saves exp_'s own result. Nothing to report. Two Adam steps.
"""
import torch
from torch import nn
from torch.nn import functional as F

torch.manual_seed(0)


class VAE(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(12, 8)
        self.fc21 = nn.Linear(8, 3)
        self.fc22 = nn.Linear(8, 3)
        self.fc3 = nn.Linear(3, 8)
        self.fc4 = nn.Linear(8, 12)
        self.relu = nn.ReLU()
        self.sigmoid = nn.Sigmoid()

    def encode(self, x):
        h1 = self.relu(self.fc1(x))
        return self.fc21(h1), self.fc22(h1)

    def reparameterize(self, mu, logvar):
        if self.training:
            std = logvar.mul(0.5).exp_()
            eps = std.data.new(std.size()).normal_()
            return eps.mul(std).add_(mu)
        else:
            return mu

    def decode(self, z):
        h3 = self.relu(self.fc3(z))
        return self.sigmoid(self.fc4(h3))

    def forward(self, x):
        mu, logvar = self.encode(x.view(-1, 12))
        z = self.reparameterize(mu, logvar)
        return self.decode(z), mu, logvar


model = VAE()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
data = torch.rand(4, 12)
for step in range(2):
    optimizer.zero_grad()
    recon_batch, mu, logvar = model(data)
    BCE = F.binary_cross_entropy(recon_batch, data.view(-1, 12), reduction='sum')
    KLD = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
    loss = BCE + KLD
    loss.backward()
    optimizer.step()
result = {"loss": loss.detach(), **{n: p.detach().clone() for n, p in model.named_parameters()}}
