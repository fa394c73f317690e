"""torch.distributions' BoltzmannTransform (later SoftmaxTransform), `probs /= probs.sum(-1, True)`.

Source: https://github.com/pytorch/pytorch/pull/5842 ("[distributions] Avoid in-place ops in
BoltzmannTransform. This avoids the following error in `.backward()`: RuntimeError: one of the
variables needed for gradient computation has been modified by an inplace operation"). `exp` saves
its output (ExpBackward0 uses `result`), and `/=` divides that very tensor. The fix of the PR:
`probs = probs / probs.sum(-1, True)`.
"""
import torch
from torch import nn

torch.manual_seed(0)


class BoltzmannTransform:
    def __call__(self, x):
        logprobs = x
        probs = (logprobs - logprobs.max(-1, True)[0]).exp()  # <saved>
        probs /= probs.sum(-1, True)  # <write>
        return probs


logits_net = nn.Linear(4, 5)
transform = BoltzmannTransform()
probs = transform(logits_net(torch.randn(3, 4)))
target = torch.tensor([0, 3, 4])
loss = -probs[torch.arange(3), target].log().mean()
loss.backward()
result = {"loss": loss.detach(), **{n: p.grad for n, p in logits_net.named_parameters()}}
