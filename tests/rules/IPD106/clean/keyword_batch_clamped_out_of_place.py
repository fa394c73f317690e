"""The fix for `model(**batch)`: clamp the ids out of place, and write only the model's own tensors in place."""
import torch
from torch import nn


class Tagger(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(16, 4)
        self.head = nn.Linear(4, 3)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        input_ids = input_ids.clamp(max=15)
        hidden = self.embed(input_ids)
        hidden.relu_()  # the embedding's output: the model's own tensor
        return self.head(hidden) * attention_mask.unsqueeze(-1)


def main() -> None:
    torch.manual_seed(0)
    batch = {"input_ids": torch.randint(0, 20, (2, 5)), "attention_mask": torch.ones(2, 5)}
    Tagger()(**batch).sum().backward()


main()
