"""PyG's "Creating Message Passing Networks" GCNConv, Step 6 `out += self.bias`, with max aggregation.

Source: https://github.com/pyg-team/pytorch_geometric/issues/8953 ("Inplace operation in message
passing example ... `out += self.bias` which actually makes torch fail in some cases"; fixed to
`out = out + self.bias`). The documented layer aggregates with "add"; the case where it fails is the
same tutorial's other aggregation, EdgeConv's aggr="max": the scatter-max saves its output for
backward (to route the gradient to the argmax), and the bias add overwrites it. The
propagate/aggregate step is written out with torch.scatter_reduce, as PyG's scatter does.
"""
import torch
from torch import nn

torch.manual_seed(0)


class GCNConv(nn.Module):
    def __init__(self, in_channels, out_channels):
        super().__init__()
        self.lin = nn.Linear(in_channels, out_channels, bias=False)
        self.bias = nn.Parameter(torch.empty(out_channels))
        self.reset_parameters()

    def reset_parameters(self):
        self.lin.reset_parameters()
        self.bias.data.uniform_(-0.1, 0.1)

    def forward(self, x, edge_index):
        # Step 2: Linearly transform node feature matrix.
        x = self.lin(x)
        # Steps 4-5: messages x_j, aggregated with max at the target nodes.
        row, col = edge_index
        x_j = x[row]
        index = col.view(-1, 1).expand_as(x_j)
        out = x.new_zeros(x.shape).scatter_reduce(0, index, x_j, reduce="amax", include_self=False)  # <saved>
        # Step 6: Apply a final bias vector.
        out += self.bias  # <write>
        return out


conv = GCNConv(4, 3)
x = torch.randn(5, 4)
edge_index = torch.tensor([[0, 1, 2, 3, 4, 0, 2], [1, 2, 3, 4, 0, 2, 0]])
out = conv(x, edge_index)
loss = out.square().sum()
loss.backward()
result = {"out": out.detach(), **{n: p.grad for n, p in conv.named_parameters()}}
