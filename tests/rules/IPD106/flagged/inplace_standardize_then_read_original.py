"""A standardizing module built with `inplace=True` on a tensor the caller keeps and reads again as the original."""
import torch
from torch import nn


class Standardize(nn.Module):
    def __init__(self, mean: float, std: float, inplace: bool = False) -> None:
        super().__init__()
        self.mean, self.std, self.inplace = mean, std, inplace

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.inplace:
            return x.sub_(self.mean).div_(self.std)  # expect: IPD106
        return (x - self.mean) / self.std


class Preprocess(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.standardize = Standardize(0.5, 0.25, inplace=True)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.standardize(image).unsqueeze(0)


torch.manual_seed(0)
image = torch.rand(3, 8, 8)
batch = Preprocess()(image)
shown = image.clamp(0, 1)  # expect-read: IPD106
