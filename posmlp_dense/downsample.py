"""Downsampling between levels (``levels.i.pool``)."""
from __future__ import annotations

import torch
from torch import nn

from .conv_function import conv2d
from .module_calls import must_call


class ConvDownsample(nn.Module):
    """Grouped conv3x3/2 (groups = input width) then LayerNorm over channels.

    Takes and returns channels-last (B, H, W, C) maps, the layout of every
    level. The conv pads with zeros as published; it only ever sees the real
    map, never window padding.
    """

    def __init__(self, in_dim: int, out_dim: int, norm_eps: float = 1e-6):
        super().__init__()
        self.conv = nn.Conv2d(in_dim, out_dim, kernel_size=3, stride=2,
                              padding=1, groups=in_dim)
        self.norm = nn.LayerNorm(out_dim, eps=norm_eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # conv2d (conv_function.py) reads the (B, H, W, C) map as NCHW with
        # channels-last strides, without a copy, and writes the same
        # layout; its training step's backward compiles at every size
        # (the module itself where a hook or a swap needs its call)
        conv = self.conv
        if must_call((conv, nn.Conv2d)):
            return self.norm(conv(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1))
        y = conv2d(x, conv.weight, conv.bias, conv.stride[0],
                   conv.padding[0], conv.groups, nhwc=True)
        return self.norm(y)

    @staticmethod
    def output_size(height, width):
        """Map size after the stride-2 conv (kernel 3, pad 1)."""
        return (height + 1) // 2, (width + 1) // 2
