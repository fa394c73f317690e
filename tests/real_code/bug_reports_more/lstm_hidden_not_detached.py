"""mobile-vod-bottleneck-lstm's training loop: a step per frame, the LSTM state detached per sequence.

Source: https://github.com/vikrant7/mobile-vod-bottleneck-lstm/issues/25 ("Runtime error of inplace
operation ... RuntimeError: one of the variables needed for gradient computation has been modified
by an inplace operation"), train_mvod_lstm5.py. The answer in the thread (hebangwen): "all the
hidden state wouldn't be detached in the second iteration, so we should make this line
[`net.detach_hidden()`] in the inner for loop". Frame 2's backward runs back through frame 1's
LSTM cell, whose weights `optimizer.step()` changed after frame 1. The intended program detaches
the state after each frame's step. (The detector cut to an LSTM cell and a linear head.)
"""
import torch
from torch import nn

torch.manual_seed(0)


class MobileVOD(nn.Module):
    def __init__(self, in_features=6, hidden=8, n_classes=3):
        super().__init__()
        self.lstm = nn.LSTMCell(in_features, hidden)
        self.head = nn.Linear(hidden, n_classes)
        self.hidden_size = hidden
        self.hidden = None

    def detach_hidden(self):
        if self.hidden is not None:
            self.hidden = tuple(h.detach() for h in self.hidden)

    def forward(self, x):
        if self.hidden is None:
            self.hidden = (x.new_zeros(x.size(0), self.hidden_size), x.new_zeros(x.size(0), self.hidden_size))
        self.hidden = self.lstm(x, self.hidden)  # <saved>
        return self.head(self.hidden[0])


net = MobileVOD()
criterion = nn.CrossEntropyLoss()
optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
sequences = [(torch.randn(3, 2, 6), torch.randint(0, 3, (3, 2))) for _ in range(2)]
running_loss = 0.0
for images, labels in sequences:
    for image, label in zip(images, labels):
        optimizer.zero_grad()
        confidence = net(image)  # <forward>
        loss = criterion(confidence, label)
        loss.backward(retain_graph=True)  # <backward>
        optimizer.step()  # <write>
        running_loss += loss.item()
    net.detach_hidden()  # <detach>
result = {"running_loss": torch.tensor(running_loss), **{n: p.detach().clone() for n, p in net.named_parameters()}}
