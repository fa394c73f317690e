"""pytorch/examples time_sequence_prediction (train.py), shrunk: two float64 `nn.LSTMCell`s and a
Linear, unrolled over the sequence with `input.split(1, dim=1)`, predicting `future` steps by
feeding the output back; trained with `torch.optim.LBFGS` and a closure (zero_grad, forward,
MSE, backward, return loss); after each step a prediction under `torch.no_grad()`.

`line_search_fn` can be None (the example) or "strong_wolfe". Run as a script it trains with both.
"""

from __future__ import annotations

import math

import torch
from torch import nn

HIDDEN = 8


class Sequence(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm1 = nn.LSTMCell(1, HIDDEN)
        self.lstm2 = nn.LSTMCell(HIDDEN, HIDDEN)
        self.linear = nn.Linear(HIDDEN, 1)

    def forward(self, input, future: int = 0):
        outputs = []
        h_t = torch.zeros(input.size(0), HIDDEN, dtype=torch.double)
        c_t = torch.zeros(input.size(0), HIDDEN, dtype=torch.double)
        h_t2 = torch.zeros(input.size(0), HIDDEN, dtype=torch.double)
        c_t2 = torch.zeros(input.size(0), HIDDEN, dtype=torch.double)
        for input_t in input.split(1, dim=1):
            h_t, c_t = self.lstm1(input_t, (h_t, c_t))
            h_t2, c_t2 = self.lstm2(h_t, (h_t2, c_t2))
            output = self.linear(h_t2)
            outputs += [output]
        for _ in range(future):  # predict the future from its own output
            h_t, c_t = self.lstm1(output, (h_t, c_t))
            h_t2, c_t2 = self.lstm2(h_t, (h_t2, c_t2))
            output = self.linear(h_t2)
            outputs += [output]
        return torch.cat(outputs, dim=1)


def sine_data(n: int = 4, length: int = 12) -> torch.Tensor:
    shift = torch.randint(-20, 20, (n, 1)).double()
    t = torch.arange(length, dtype=torch.double).unsqueeze(0) + shift
    return torch.sin(t / 4.0 / math.pi * 2)


def build(line_search_fn=None):
    seq = Sequence().double()
    optimizer = torch.optim.LBFGS(seq.parameters(), lr=0.8, max_iter=4, line_search_fn=line_search_fn)
    return seq, optimizer


def train(objs, steps: int = 2):
    seq, optimizer = objs
    criterion = nn.MSELoss()
    data = sine_data()
    input, target = data[1:, :-1], data[1:, 1:]
    test_input, test_target = data[:1, :-1], data[:1, 1:]
    preds = []
    for _ in range(steps):

        def closure():
            optimizer.zero_grad()
            out = seq(input)
            loss = criterion(out, target)
            loss.backward()
            return loss

        optimizer.step(closure)
        with torch.no_grad():
            future = 3
            pred = seq(test_input, future=future)
            criterion(pred[:, :-future], test_target)
            preds.append(pred)
    return preds


def modules(objs) -> tuple:
    return (objs[0],)


def main() -> None:
    torch.set_num_threads(1)
    for ls in (None, "strong_wolfe"):
        torch.manual_seed(0)
        train(build(ls))
        print("lbfgs", ls, "ok")


if __name__ == "__main__":
    main()
