"""`nn.RReLU` ending each checkpointed block: silently wrong gradients, bit-exact forward.

Source: https://github.com/pytorch/pytorch/issues/193671 ("Silent wrong gradients: nn.RReLU under
non-reentrant checkpointing saves uninitialized noise"). `rrelu_with_noise` saves `self` and
`noise` for backward, then its kernel draws the noise into `noise`. Under
`checkpoint(..., use_reentrant=False)` the recompute stops once it has saved as many tensors as
the forward did; RReLU's saves are each block's last, so its kernel never runs again and backward
reads the `empty_like` buffer as it was. The intended program is the same network without
checkpointing (the report's reference). Two SGD steps.
"""
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

torch.manual_seed(0)


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.fc = nn.Linear(d, d)
        self.act = nn.RReLU(0.1, 0.3)

    def forward(self, x):
        return self.act(self.fc(x))  # <write>


class Net(nn.Module):
    def __init__(self, d=12, depth=2):
        super().__init__()
        self.blocks = nn.ModuleList(Block(d) for _ in range(depth))
        self.head = nn.Linear(d, 1)

    def forward(self, x):
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False)  # <checkpoint>
        return self.head(x)


model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
data, target = torch.randn(6, 12), torch.randn(6, 1)
for step in range(2):
    optimizer.zero_grad()
    out = model(data)
    loss = nn.functional.mse_loss(out, target)
    loss.backward()
    optimizer.step()
result = {"loss": loss.detach(), **{n: p.detach().clone() for n, p in model.named_parameters()}}
