"""mmocr's FPEM_FFM neck: `c2_ffm += c2` sums the FPEM outputs into the first one, a ReLU output.

Source: https://github.com/open-mmlab/mmocr/pull/884 ("[Fix] Fix a bug that may cause inplace
operation error", for issues #878 and #648, PSENet/PANet training), mmocr/models/textdet/necks/
fpem_ffm.py:151. After the first FPEM, `c2_ffm` is that FPEM's `c2`, the output of the ReLU that
ends each SeparableConv2d (ReluBackward0 saves its output); the second FPEM's `+=` overwrites it.
The PR's fix: `c2_ffm = c2_ffm + c2` (and the same for c3..c5). Channels and sizes cut down.
"""
import torch
import torch.nn.functional as F
from torch import nn

torch.manual_seed(0)


class SeparableConv2d(nn.Module):
    def __init__(self, in_channels, out_channels, stride=1):
        super().__init__()
        self.depthwise_conv = nn.Conv2d(in_channels, in_channels, 3, padding=1, stride=stride, groups=in_channels)
        self.pointwise_conv = nn.Conv2d(in_channels, out_channels, 1)
        self.bn = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU()

    def forward(self, x):
        x = self.depthwise_conv(x)
        x = self.pointwise_conv(x)
        x = self.bn(x)
        x = self.relu(x)  # <saved>
        return x


class FPEM(nn.Module):
    def __init__(self, in_channels=4):
        super().__init__()
        self.up_add1 = SeparableConv2d(in_channels, in_channels, 1)
        self.up_add2 = SeparableConv2d(in_channels, in_channels, 1)
        self.up_add3 = SeparableConv2d(in_channels, in_channels, 1)
        self.down_add1 = SeparableConv2d(in_channels, in_channels, 2)
        self.down_add2 = SeparableConv2d(in_channels, in_channels, 2)
        self.down_add3 = SeparableConv2d(in_channels, in_channels, 2)

    def forward(self, c2, c3, c4, c5):
        # upsample
        c4 = self.up_add1(self._upsample_add(c5, c4))
        c3 = self.up_add2(self._upsample_add(c4, c3))
        c2 = self.up_add3(self._upsample_add(c3, c2))
        # downsample
        c3 = self.down_add1(self._upsample_add(c3, c2))
        c4 = self.down_add2(self._upsample_add(c4, c3))
        c5 = self.down_add3(self._upsample_add(c5, c4))
        return c2, c3, c4, c5

    def _upsample_add(self, x, y):
        return F.interpolate(x, size=y.size()[2:]) + y


class FPEM_FFM(nn.Module):
    def __init__(self, in_channels=(4, 8, 8, 8), conv_out=4, fpem_repeat=2):
        super().__init__()
        self.reduce_conv_c2 = nn.Sequential(nn.Conv2d(in_channels[0], conv_out, 1), nn.BatchNorm2d(conv_out), nn.ReLU())
        self.reduce_conv_c3 = nn.Sequential(nn.Conv2d(in_channels[1], conv_out, 1), nn.BatchNorm2d(conv_out), nn.ReLU())
        self.reduce_conv_c4 = nn.Sequential(nn.Conv2d(in_channels[2], conv_out, 1), nn.BatchNorm2d(conv_out), nn.ReLU())
        self.reduce_conv_c5 = nn.Sequential(nn.Conv2d(in_channels[3], conv_out, 1), nn.BatchNorm2d(conv_out), nn.ReLU())
        self.fpems = nn.ModuleList([FPEM(conv_out) for _ in range(fpem_repeat)])

    def forward(self, x):
        c2, c3, c4, c5 = x
        # reduce channel
        c2 = self.reduce_conv_c2(c2)
        c3 = self.reduce_conv_c3(c3)
        c4 = self.reduce_conv_c4(c4)
        c5 = self.reduce_conv_c5(c5)

        # FPEM
        for i, fpem in enumerate(self.fpems):
            c2, c3, c4, c5 = fpem(c2, c3, c4, c5)
            if i == 0:
                c2_ffm = c2
                c3_ffm = c3
                c4_ffm = c4
                c5_ffm = c5
            else:
                c2_ffm += c2  # <write-c2>
                c3_ffm += c3  # <write-c3>
                c4_ffm += c4  # <write-c4>
                c5_ffm += c5  # <write-c5>

        # FFM
        c5 = F.interpolate(c5_ffm, c2_ffm.size()[-2:], mode='nearest')
        c4 = F.interpolate(c4_ffm, c2_ffm.size()[-2:], mode='nearest')
        c3 = F.interpolate(c3_ffm, c2_ffm.size()[-2:], mode='nearest')
        outs = [c2_ffm, c3, c4, c5]
        return tuple(outs)


neck = FPEM_FFM()
feats = [torch.randn(2, 4, 16, 16), torch.randn(2, 8, 8, 8), torch.randn(2, 8, 4, 4), torch.randn(2, 8, 2, 2)]
outs = neck(feats)
loss = torch.cat(outs, 1).square().mean()
loss.backward()
result = {"loss": loss.detach(), **{n: p.grad for n, p in neck.named_parameters()}}
