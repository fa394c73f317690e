"""`model(**batch)`, as Hugging Face's Trainer calls a model: the forward clamps the caller's ids in place."""
import torch
from torch import nn


class Tagger(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(16, 4)
        self.head = nn.Linear(4, 3)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        input_ids.clamp_(max=15)  # expect: IPD106
        return self.head(self.embed(input_ids)) * attention_mask.unsqueeze(-1)


def main() -> None:
    torch.manual_seed(0)
    batch = {"input_ids": torch.randint(0, 20, (2, 5)), "attention_mask": torch.ones(2, 5)}
    Tagger()(**batch).sum().backward()


main()
