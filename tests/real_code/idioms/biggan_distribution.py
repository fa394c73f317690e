"""A `torch.Tensor` subclass built from a fresh tensor: BigGAN-PyTorch's `Distribution`.

Modelled on ajbrock/BigGAN-PyTorch: utils.py `Distribution(torch.Tensor)` (constructed as
`Distribution(torch.randn(...))`, `init_distribution`, in-place `sample_()` via `normal_` /
`random_`, and a `to()` override that wraps a new `Distribution(self)` and assigns `.data`),
`prepare_z_y`, the `ema` class (which holds `source.state_dict()` and `target.state_dict()` from
construction and updates with `target_dict[k].data.copy_(...)`), `toggle_grad`, the `G_D`
wrapper (G under `torch.set_grad_enabled(train_G)`, D on `cat([G_z, x])`, output split), hinge
losses, and train_fns.GAN_training_function (D steps with `z_.sample_(); y_.sample_()` per
accumulation, then the G step, then `ema.update(itr)`).

Run as a script it trains 3 iterations.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

DIM_Z, N_CLASSES, DIM_X, HID, BATCH = 6, 3, 10, 16, 4


class Distribution(torch.Tensor):
    def init_distribution(self, dist_type, **kwargs):
        self.dist_type = dist_type
        self.dist_kwargs = kwargs
        if dist_type == "normal":
            self.mean, self.var = kwargs["mean"], kwargs["var"]
        elif dist_type == "categorical":
            self.num_categories = kwargs["num_categories"]

    def sample_(self):
        if self.dist_type == "normal":
            self.normal_(self.mean, self.var)
        elif self.dist_type == "categorical":
            self.random_(0, self.num_categories)

    def to(self, *args, **kwargs):  # wrap the converted tensor in a Distribution too
        new_obj = Distribution(self)
        new_obj.init_distribution(self.dist_type, **self.dist_kwargs)
        new_obj.data = super().to(*args, **kwargs)
        return new_obj


def prepare_z_y(batch_size, dim_z, nclasses, device="cpu", z_var=1.0):
    z_ = Distribution(torch.randn(batch_size, dim_z, requires_grad=False))
    z_.init_distribution("normal", mean=0, var=z_var)
    z_ = z_.to(device, torch.float32)
    y_ = Distribution(torch.zeros(batch_size, requires_grad=False))
    y_.init_distribution("categorical", num_categories=nclasses)
    y_ = y_.to(device, torch.int64)
    return z_, y_


class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.shared = nn.Embedding(N_CLASSES, 4)
        self.fc1 = nn.Linear(DIM_Z + 4, HID)
        self.bn = nn.BatchNorm1d(HID)
        self.fc2 = nn.Linear(HID, DIM_X)

    def forward(self, z, y):
        h = F.relu(self.bn(self.fc1(torch.cat([z, y], 1))))
        return torch.tanh(self.fc2(h))


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(DIM_X, HID)
        self.linear = nn.Linear(HID, 1)
        self.embed = nn.Embedding(N_CLASSES, HID)

    def forward(self, x, y):
        h = F.relu(self.fc1(x))
        out = self.linear(h)
        return out + torch.sum(self.embed(y) * h, 1, keepdim=True)  # projection discriminator


class G_D(nn.Module):
    def __init__(self, G, D):
        super().__init__()
        self.G, self.D = G, D

    def forward(self, z, gy, x=None, dy=None, train_G=False):
        with torch.set_grad_enabled(train_G):
            G_z = self.G(z, self.G.shared(gy))
        D_input = torch.cat([G_z, x], 0) if x is not None else G_z
        D_class = torch.cat([gy, dy], 0) if dy is not None else gy
        D_out = self.D(D_input, D_class)
        if x is not None:
            return torch.split(D_out, [G_z.shape[0], x.shape[0]])
        return D_out


class ema:
    def __init__(self, source, target, decay=0.9, start_itr=0):
        self.source, self.target, self.decay, self.start_itr = source, target, decay, start_itr
        self.source_dict = self.source.state_dict()
        self.target_dict = self.target.state_dict()
        with torch.no_grad():
            for key in self.source_dict:
                self.target_dict[key].data.copy_(self.source_dict[key].data)

    def update(self, itr=None):
        decay = 0.0 if itr and itr < self.start_itr else self.decay
        with torch.no_grad():
            for key in self.source_dict:
                self.target_dict[key].data.copy_(
                    self.target_dict[key].data * decay + self.source_dict[key].data * (1 - decay)
                )


def toggle_grad(model, on_or_off):
    for param in model.parameters():
        param.requires_grad = on_or_off


def loss_hinge_dis(dis_fake, dis_real):
    return torch.mean(F.relu(1.0 - dis_real)), torch.mean(F.relu(1.0 + dis_fake))


def loss_hinge_gen(dis_fake):
    return -torch.mean(dis_fake)


class State:
    def __init__(self):
        self.G, self.D, self.G_ema = Generator(), Discriminator(), Generator()
        self.G.optim = torch.optim.Adam(self.G.parameters(), lr=1e-3, betas=(0.0, 0.999), eps=1e-6)
        self.D.optim = torch.optim.Adam(self.D.parameters(), lr=4e-3, betas=(0.0, 0.999), eps=1e-6)
        self.GD = G_D(self.G, self.D)
        self.ema = ema(self.G, self.G_ema, decay=0.9, start_itr=1)
        self.z_, self.y_ = prepare_z_y(BATCH, DIM_Z, N_CLASSES)
        self.itr = 0


def build() -> State:
    return State()


def training_step(s: State, x, y, num_D_steps=2, num_D_accumulations=2, num_G_accumulations=1):
    G, D, GD, z_, y_ = s.G, s.D, s.GD, s.z_, s.y_
    G.optim.zero_grad()
    D.optim.zero_grad()
    x, y = torch.split(x, BATCH), torch.split(y, BATCH)
    counter = 0
    toggle_grad(D, True)
    toggle_grad(G, False)
    for _ in range(num_D_steps):
        D.optim.zero_grad()
        for _ in range(num_D_accumulations):
            z_.sample_()
            y_.sample_()
            D_fake, D_real = GD(z_[:BATCH], y_[:BATCH], x[counter], y[counter], train_G=False)
            D_loss_real, D_loss_fake = loss_hinge_dis(D_fake, D_real)
            D_loss = (D_loss_real + D_loss_fake) / float(num_D_accumulations)
            D_loss.backward()
            counter += 1
        D.optim.step()
    toggle_grad(D, False)
    toggle_grad(G, True)
    G.optim.zero_grad()
    for _ in range(num_G_accumulations):
        z_.sample_()
        y_.sample_()
        D_fake = GD(z_, y_, train_G=True)
        G_loss = loss_hinge_gen(D_fake) / float(num_G_accumulations)
        G_loss.backward()
    G.optim.step()
    s.itr += 1
    s.ema.update(s.itr)
    return {"G_loss": float(G_loss.item()), "D_loss_real": float(D_loss_real.item()), "D_loss_fake": float(D_loss_fake.item())}


def train(s: State, iterations: int = 3):
    out = []
    for _ in range(iterations):
        x = torch.randn(4 * BATCH, DIM_X)
        y = torch.randint(0, N_CLASSES, (4 * BATCH,))
        out.append(training_step(s, x, y))
    assert type(s.z_) is Distribution and type(s.y_) is Distribution and s.y_.dtype == torch.int64
    return out


def modules(s: State) -> tuple:
    return s.G, s.D, s.G_ema


def main() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    s = build()
    print(train(s)[-1])


if __name__ == "__main__":
    main()
