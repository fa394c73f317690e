"""Re-initialising parameters with `nn.init` (which writes under no_grad) and clipping grads in place."""
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
for m in model.modules():
    if isinstance(m, nn.Linear):
        nn.init.xavier_uniform_(m.weight)
        nn.init.zeros_(m.bias)
model(torch.randn(3, 4)).sum().backward()
nn.utils.clip_grad_norm_(model.parameters(), 1.0)
