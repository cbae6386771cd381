"""The convolutional stem: image -> stride-4 feature map (``patch_embed``)."""
from __future__ import annotations

import torch
from torch import nn

from .conv_function import conv2d
from .module_calls import must_call


class ConvStem(nn.Module):
    """conv3x3/2 -> BN -> GELU -> conv3x3/2 -> BN -> GELU -> conv1x1 -> BN.

    Widths in_channels -> dim/2 -> dim -> dim, BatchNorm eps 1e-6, all convs
    with bias, as published.
    """

    def __init__(self, in_channels: int, dim: int):
        super().__init__()
        widths = (in_channels, dim // 2, dim, dim)
        kernels, strides = (3, 3, 1), (2, 2, 1)
        self.projs = nn.ModuleList([
            nn.Conv2d(widths[i], widths[i + 1], kernels[i], strides[i],
                      padding=kernels[i] // 2) for i in range(3)])
        self.norms = nn.ModuleList([
            nn.BatchNorm2d(widths[i + 1], eps=1e-6) for i in range(3)])
        self.act = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """NCHW image -> channels-last (B, H/4, W/4, C) map."""
        # channels-last: the convs then need no internal re-layout of their
        # (large) maps, and the output permutes to (B, H, W, C) for free.
        # Except when training on a CPU: there oneDNN's weight gradient of
        # a channels-last conv is several times slower (the stem's step at
        # 2x512x512: 316 ms channels-last, 211 ms NCHW).
        # (an FX Proxy, whose device is unknown, gets channels-last)
        if not (isinstance(x, torch.Tensor) and x.device.type == 'cpu'
                and torch.is_grad_enabled() and self.training):
            x = x.contiguous(memory_format=torch.channels_last)
        x = self.act(self.norms[0](self._conv(0, x)))
        x = self.act(self.norms[1](self._conv(1, x)))
        x = self.norms[2](self._conv(2, x))
        return x.permute(0, 2, 3, 1)

    def _conv(self, i: int, x: torch.Tensor) -> torch.Tensor:
        # conv_function.conv2d: a backward that compiles at every size;
        # the module itself where a hook or a swap needs its call
        proj = self.projs[i]
        if must_call((proj, nn.Conv2d)):
            return proj(x)
        return conv2d(x, proj.weight, proj.bias, proj.stride[0],
                      proj.padding[0], proj.groups)

    @staticmethod
    def output_size(height, width):
        """Map size after the stem's two stride-2 convs (kernel 3, pad 1)."""
        for _ in range(2):
            height, width = (height + 1) // 2, (width + 1) // 2
        return height, width
