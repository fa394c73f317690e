"""An ordinary training loop over checkpointed conv and MLP blocks (checkpoint_sequential and
checkpoint, non-reentrant), with the optimizer step after backward: every recompute matches."""
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint, checkpoint_sequential


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(inplace=True), nn.Conv2d(8, 8, 3, padding=1), nn.GELU(),
            nn.MaxPool2d(2),
        )
        self.head = nn.Sequential(nn.Linear(8 * 4 * 4, 32), nn.LayerNorm(32), nn.SiLU(), nn.Linear(32, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = checkpoint_sequential(self.features, 2, x, use_reentrant=False)
        return checkpoint(self.head, h.flatten(1), use_reentrant=False)


def main() -> None:
    torch.manual_seed(0)
    net = Net()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    for _ in range(2):
        x, target = torch.randn(4, 3, 8, 8), torch.randint(0, 10, (4,))
        loss = nn.functional.cross_entropy(net(x), target)
        opt.zero_grad()
        loss.backward()
        opt.step()


main()
