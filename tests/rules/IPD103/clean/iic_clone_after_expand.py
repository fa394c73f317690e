"""The fix the IIC and VQA_ReGAT reports settled on: `.clone()` after `expand()`, so the
masked write lands in memory of its own and backward runs (xu-ji/IIC#27)."""
import torch

EPS = 0.4


def iic_loss(x_out: torch.Tensor) -> torch.Tensor:
    p_i_j = x_out.softmax(1)
    k = p_i_j.shape[1]
    p_j = p_i_j.sum(dim=0).view(1, k).expand(k, k).clone()
    p_j[(p_j < EPS).data] = EPS
    return -(p_i_j * p_j.log()).sum()


def main() -> None:
    torch.manual_seed(0)
    x = torch.randn(3, 3, requires_grad=True)
    iic_loss(x).backward()


main()
