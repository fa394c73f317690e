"""IIC's mutual-information loss as its authors wrote it (xu-ji/IIC#27, also
linjieli222/VQA_ReGAT#39): `p_j[mask] = EPS` on an `expand()`ed tensor passes forward
(with a deprecation warning) and raises the memory-overlap error inside backward, where
PyTorch's traceback names only `backward()`. The finding names the forward write."""
import warnings

import torch

EPS = 0.4


def iic_loss(x_out: torch.Tensor) -> torch.Tensor:
    p_i_j = x_out.softmax(1)
    k = p_i_j.shape[1]
    p_j = p_i_j.sum(dim=0).view(1, k).expand(k, k)
    p_j[(p_j < EPS).data] = EPS  # expect: IPD103
    return -(p_i_j * p_j.log()).sum()


def main() -> None:
    torch.manual_seed(0)
    x = torch.randn(3, 3, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Use of index_put_ on expanded tensors is deprecated"
        iic_loss(x).backward()


main()
