"""OWL-ViT's class head normalizes its embeddings with `/=` (transformers modeling_owlvit.py:1296-1297).

Source: https://github.com/huggingface/transformers/issues/24525 ("Backward pass error during
OWL-ViT finetuning": "the error is the operator "/=" which does an inplace operation"), fixed by
PR #24529, where the first fix, `x = x / torch.linalg.norm(...) + 1e-6`, changed the meaning and the
reviewer corrected it to `x = x / (torch.linalg.norm(...) + 1e-6)`. `linalg.norm` saves its input,
which `/=` then overwrites. `query_embeds` comes from the text tower (here a Linear).
"""
import torch
from torch import nn

torch.manual_seed(0)


class OwlViTClassPredictionHead(nn.Module):
    def __init__(self, hidden_size=8, query_dim=6):
        super().__init__()
        self.dense0 = nn.Linear(hidden_size, query_dim)
        self.logit_shift = nn.Linear(hidden_size, 1)
        self.logit_scale = nn.Linear(hidden_size, 1)
        self.elu = nn.ELU()

    def forward(self, image_embeds, query_embeds):
        image_class_embeds = self.dense0(image_embeds)

        # Normalize image and text features
        image_class_embeds /= torch.linalg.norm(image_class_embeds, dim=-1, keepdim=True) + 1e-6  # <write-image>
        query_embeds /= torch.linalg.norm(query_embeds, dim=-1, keepdim=True) + 1e-6  # <write-query>

        # Get class predictions
        pred_logits = torch.einsum("...pd,...qd->...pq", image_class_embeds, query_embeds)

        # Apply a learnable shift and scale to logits
        logit_shift = self.logit_shift(image_embeds)
        logit_scale = self.elu(self.logit_scale(image_embeds)) + 1
        pred_logits = (pred_logits + logit_shift) * logit_scale
        return pred_logits


head = OwlViTClassPredictionHead()
text_projection = nn.Linear(5, 6)
image_embeds = torch.randn(2, 4, 8)
query_embeds = text_projection(torch.randn(2, 3, 5))
pred_logits = head(image_embeds, query_embeds)
loss = pred_logits.square().mean()
loss.backward()
result = {
    "loss": loss.detach(),
    **{n: p.grad for n, p in head.named_parameters()},
    **{f"text.{n}": p.grad for n, p in text_projection.named_parameters()},
}
