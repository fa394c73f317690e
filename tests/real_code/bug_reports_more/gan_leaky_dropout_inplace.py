"""A GAN tutorial's discriminator with `LeakyReLU(inplace=True)` followed by `Dropout(inplace=True)`.

Source: https://github.com/dreamgonfly/GAN-tutorial/issues/1 ("D_loss.backward() ... 'one of the
variables needed for gradient computation has been modified by an inplace operation'"; the answer:
remove `inplace = True` from every LeakyReLU and Dropout of the Generator and Discriminator classes).
An in-place LeakyReLU saves its output (its backward reads the sign of the result); the in-place
Dropout scales that very tensor. The intended program: both modules out of place.
"""
import torch
import torch.nn as nn

torch.manual_seed(0)


class Discriminator(nn.Module):
    def __init__(self):
        super(Discriminator, self).__init__()
        self.main = nn.Sequential(
            nn.Linear(in_features=16, out_features=8),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Dropout(inplace=True),  # <origin>
            nn.Linear(in_features=8, out_features=1),
            nn.Sigmoid())

    def forward(self, inputs):
        inputs = inputs.view(-1, 16)
        return self.main(inputs)  # <write>


D = Discriminator()
criterion = nn.BCELoss()
D_optimizer = torch.optim.Adam(D.parameters(), lr=0.0002, betas=(0.5, 0.999))
real = torch.randn(4, 1, 4, 4)
D_result = D(real)
D_loss = criterion(D_result.view(-1), torch.ones(4))
D.zero_grad()
D_loss.backward()
D_optimizer.step()
result = {"loss": D_loss.detach(), **{n: p.detach().clone() for n, p in D.named_parameters()}}
