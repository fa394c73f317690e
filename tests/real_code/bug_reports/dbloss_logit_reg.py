"""DistributionBalancedLoss's ResampleLoss.logit_reg_functions: `logits += self.neg_bias`.

Source: https://github.com/wutong16/DistributionBalancedLoss/issues/20 ("one of the variables
needed for gradient computation has been modified by an inplace operation: [torch.FloatTensor
[64, 109]], which is output 0 of SigmoidBackward0"), mllt/models/losses/resample_loss.py. The
error names SigmoidBackward0: the scores handed to the loss come out of a sigmoid, which saves its
output, and the loss's helper adds the negative-class bias into that tensor in place.
"""
import torch
import torch.nn.functional as F
from torch import nn

torch.manual_seed(0)


class ResampleLoss(nn.Module):
    def __init__(self, num_classes=6, logit_reg=dict(neg_scale=5.0, neg_bias=0.1)):
        super().__init__()
        self.logit_reg = logit_reg
        self.neg_scale = logit_reg['neg_scale'] if 'neg_scale' in logit_reg else 1.0
        class_freq = torch.arange(1.0, num_classes + 1)
        train_num = 2.0 * num_classes
        neg_bias = logit_reg['neg_bias'] if 'neg_bias' in logit_reg else 0.0
        self.neg_bias = - torch.log(train_num / class_freq - 1) * neg_bias / self.neg_scale

    def forward(self, cls_score, label):
        weight = torch.ones_like(cls_score)
        cls_score, weight = self.logit_reg_functions(label.float(), cls_score, weight)
        return F.binary_cross_entropy_with_logits(cls_score, label.float(), weight=weight)

    def logit_reg_functions(self, labels, logits, weight=None):
        if not self.logit_reg:
            return logits, weight
        if 'neg_bias' in self.logit_reg:
            logits += self.neg_bias  # <write>
        if 'neg_scale' in self.logit_reg:
            logits = logits * (1 - labels) * self.neg_scale + logits * labels
            weight = weight / self.neg_scale * (1 - labels) + weight * labels
        return logits, weight


model = nn.Sequential(nn.Linear(8, 6), nn.Sigmoid())
criterion = ResampleLoss()
scores = model(torch.randn(4, 8))  # <saved>
labels = torch.randint(0, 2, (4, 6))
loss = criterion(scores, labels)
loss.backward()
result = {"loss": loss.detach(), "scores": scores.detach(), **{n: p.grad for n, p in model.named_parameters()}}
