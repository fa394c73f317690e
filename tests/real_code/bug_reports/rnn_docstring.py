"""torch.nn.RNN's docstring, "Efficient implementation equivalent to the following", trained.

Source: https://github.com/pytorch/pytorch/issues/165621 ("The example code doesn't work with
backward"), the program as reported there (nn.RNN(10, 20, 2), input 5x3x10, h0 2x3x20, MSE to
ones). `h_t[layer] = torch.tanh(...)` writes the hidden state in place; the next layer's
`input_t = h_t[layer - 1]` is a view of that same tensor, saved by the matmul (MmBackward0.self).
Intended program: pytorch/pytorch PR #173888 (hidden states built as a list, stacked).
"""
import torch
import torch.nn as nn

torch.manual_seed(0)
rnn = nn.RNN(10, 20, 2)
params = dict(rnn.named_parameters())


def forward(x, hx=None, batch_first=False):
    if batch_first:
        x = x.transpose(0, 1)
    seq_len, batch_size, _ = x.size()
    if hx is None:
        hx = torch.zeros(rnn.num_layers, batch_size, rnn.hidden_size)
    h_t_minus_1 = hx.clone()
    h_t = hx.clone()
    output = []
    for t in range(seq_len):
        for layer in range(rnn.num_layers):
            input_t = x[t] if layer == 0 else h_t[layer - 1]
            h_t[layer] = torch.tanh(  # <write>
                input_t @ params[f"weight_ih_l{layer}"].T  # <saved>
                + h_t_minus_1[layer] @ params[f"weight_hh_l{layer}"].T
                + params[f"bias_hh_l{layer}"]
                + params[f"bias_ih_l{layer}"]
            )
        output.append(h_t[-1].clone())
        h_t_minus_1 = h_t.clone()
    output = torch.stack(output)
    if batch_first:
        output = output.transpose(0, 1)
    return output, h_t


input = torch.randn(5, 3, 10)
h0 = torch.randn(2, 3, 20)
output, hn = forward(input, h0)

target = torch.ones_like(output)
loss = nn.functional.mse_loss(output, target)
loss.backward()
result = {"loss": loss.detach(), **{n: p.grad for n, p in rnn.named_parameters()}}
