"""siamese-triplet's EmbeddingNetL2: `output /= output.pow(2).sum(1, keepdim=True).sqrt()`.

Source: https://github.com/adambielski/siamese-triplet/issues/51 ("replacing with EmbeddingNetL2
gives Error: RuntimeError: one of the variables needed for gradient computation has been modified
by an inplace operation: [torch.cuda.FloatTensor [128, 128]], which is output 0 of AddmmBackward"),
networks.py. `pow` saves its input, the embedding the last Linear made; `/=` overwrites it. The
intended program divides out of place. (The conv trunk cut to one small conv.)
"""
import torch
import torch.nn as nn

torch.manual_seed(0)


class EmbeddingNet(nn.Module):
    def __init__(self):
        super(EmbeddingNet, self).__init__()
        self.convnet = nn.Sequential(nn.Conv2d(1, 4, 3), nn.PReLU(), nn.MaxPool2d(2, stride=2))
        self.fc = nn.Sequential(nn.Linear(4 * 3 * 3, 16), nn.PReLU(), nn.Linear(16, 2))

    def forward(self, x):
        output = self.convnet(x)
        output = output.view(output.size()[0], -1)
        output = self.fc(output)
        return output


class EmbeddingNetL2(EmbeddingNet):
    def __init__(self):
        super(EmbeddingNetL2, self).__init__()

    def forward(self, x):
        output = super(EmbeddingNetL2, self).forward(x)
        output /= output.pow(2).sum(1, keepdim=True).sqrt()  # <write>
        return output


class TripletLoss(nn.Module):
    def __init__(self, margin):
        super(TripletLoss, self).__init__()
        self.margin = margin

    def forward(self, anchor, positive, negative):
        distance_positive = (anchor - positive).pow(2).sum(1)
        distance_negative = (anchor - negative).pow(2).sum(1)
        losses = torch.relu(distance_positive - distance_negative + self.margin)
        return losses.mean()


model = EmbeddingNetL2()
anchor, positive, negative = (model(torch.randn(3, 1, 8, 8)) for _ in range(3))
loss = TripletLoss(1.0)(anchor, positive, negative)
loss.backward()
result = {"loss": loss.detach(), **{n: p.grad for n, p in model.named_parameters()}}
