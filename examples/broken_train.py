"""A small training script with an in-place bug (for the guide's "fix a broken script" path).

    python examples/broken_train.py                 # RuntimeError at backward, naming neither line
    inplace-doctor run examples/broken_train.py     # the same run, with both culprits and the fix
"""

import torch
from torch import nn


class Tagger(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Linear(16, 32)
        self.head = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor, pad: int) -> torch.Tensor:
        feats = torch.sigmoid(self.encoder(x))
        feats[:, 32 - pad:] = 0  # zero the padded features
        return self.head(feats)


torch.manual_seed(0)
model = Tagger()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(64, 16), torch.randint(0, 4, (64,))
for _step in range(1, 21):
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(x, pad=8), y)
    loss.backward()
    opt.step()
print(f"final loss {loss.item():.4f}")
