"""The convolutional stem: image -> stride-4 feature map (``patch_embed``)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

# CPU inference makes the stem's stride-2 map in strips of about this many
# bytes (two of its rows per output row); see ConvStem._forward_in_place.
STEM_STRIP_BYTES = 8 << 20


class ConvStem(nn.Module):
    """conv3x3/2 -> BN -> GELU -> conv3x3/2 -> BN -> GELU -> conv1x1 -> BN.

    Widths in_channels -> dim/2 -> dim -> dim, BatchNorm eps 1e-6, all convs
    with bias, as published.
    """

    def __init__(self, in_channels: int, dim: int):
        super().__init__()
        widths = (in_channels, dim // 2, dim, dim)
        kernels, strides = (3, 3, 1), (2, 2, 1)
        self.projs = nn.Sequential(*[
            nn.Conv2d(widths[i], widths[i + 1], kernels[i], strides[i],
                      padding=kernels[i] // 2) for i in range(3)])
        self.norms = nn.Sequential(*[
            nn.BatchNorm2d(widths[i + 1], eps=1e-6) for i in range(3)])
        self.act = nn.GELU()

    def forward(self, x: torch.Tensor, in_place: bool = False
                ) -> torch.Tensor:
        """NCHW image -> channels-last (B, H/4, W/4, C) map.

        ``in_place`` (INFERENCE mode on the CPU, see forward_mode.py): the
        map is made in strips of rows, and each conv's output is normalized
        and activated where it lies. On the CPU fresh maps cost page faults;
        a GPU's caching allocator reuses memory, and the aliased BatchNorm
        is unverified there.
        """
        # channels-last: the convs then need no internal re-layout of their
        # (large) maps, and the output permutes to (B, H, W, C) for free.
        # Except when training on a CPU: there oneDNN's weight gradient of
        # a channels-last conv is several times slower (the stem's step at
        # 2x512x512: 316 ms channels-last, 211 ms NCHW).
        # (an FX Proxy, whose device is unknown, gets channels-last)
        if not (isinstance(x, torch.Tensor) and x.device.type == 'cpu'
                and torch.is_grad_enabled() and self.training):
            x = x.contiguous(memory_format=torch.channels_last)
        if in_place and not self.training and all(
                not n.training and n.running_mean is not None
                for n in self.norms):
            # (BatchNorms that use batch statistics need the whole map)
            x = self._forward_in_place(x)
        else:
            x = self.act(self.norms[0](self.projs[0](x)))
            x = self.act(self.norms[1](self.projs[1](x)))
            x = self.norms[2](self.projs[2](x))
        return x.permute(0, 2, 3, 1)

    @staticmethod
    def output_size(height, width):
        """Map size after the stem's two stride-2 convs (kernel 3, pad 1)."""
        for _ in range(2):
            height, width = (height + 1) // 2, (width + 1) // 2
        return height, width

    def _forward_in_place(self, x: torch.Tensor) -> torch.Tensor:
        """Inference, a strip of output rows at a time.

        The stride-2 map is the model's largest (at 800x1333, 51 MB for
        PosMLP-T). Made whole, it is a fresh block that glibc maps from the
        OS and faults in page by page on every call; in strips of about
        STEM_STRIP_BYTES each piece is reused memory and is still in the
        caches when the next conv reads it. Each strip's convs see the same
        input rows and zero padding as on the whole map, so they compute the
        same sums (oneDNN may order them differently: rounding-level
        differences)."""
        B, _, H, W = x.shape
        H1 = (H + 1) // 2
        H2, W2 = self.output_size(H, W)
        out = x.new_empty(B, H2, W2, self.projs[2].out_channels)
        stride2_row = B * ((W + 1) // 2) * self.projs[0].out_channels * \
            x.element_size()
        rows = max(1, STEM_STRIP_BYTES // (2 * stride2_row))
        for r0 in range(0, H2, rows):
            r1 = min(H2, r0 + rows)
            # output rows r0..r1-1 read the stride-2 rows 2*r0-1 .. 2*r1-1
            first = max(0, 2 * r0 - 1)
            y = self._stride2_rows(0, x, 0, H, first, min(H1, 2 * r1))
            y = self._stride2_rows(1, y, first, H1, r0, r1)
            y = self._norm_act(2, self.projs[2](y))
            out[:, r0:r1].copy_(y.permute(0, 2, 3, 1))
        return out.permute(0, 3, 1, 2)

    def _stride2_rows(self, i: int, src: torch.Tensor, src_first: int,
                      height: int, first: int, stop: int) -> torch.Tensor:
        """Rows ``first .. stop-1`` of conv ``i`` (kernel 3, stride 2,
        padding 1), normalized and activated. The conv's input has
        ``height`` rows, of which ``src`` holds those from ``src_first`` on
        (at least the ones these output rows read). Rows past the input's
        edges read zeros, as the conv's padding does on the whole map."""
        lo, hi = 2 * first - 1, 2 * stop  # input rows lo .. hi - 1
        rows = src[:, :, max(lo, 0) - src_first:min(hi, height) - src_first]
        top, bottom = max(0, -lo), max(0, hi - height)
        if top or bottom:
            rows = F.pad(rows, (0, 0, top, bottom)).contiguous(
                memory_format=torch.channels_last)
        proj = self.projs[i]
        y = F.conv2d(rows, proj.weight, proj.bias, stride=2,
                     padding=(0, proj.padding[1]))
        return self._norm_act(i, y)

    def _norm_act(self, i: int, x: torch.Tensor) -> torch.Tensor:
        """BatchNorm ``i`` with its running statistics (elementwise, so
        written over ``x``), then the GELU after the first two."""
        norm = self.norms[i]
        torch.ops.aten.native_batch_norm.out(
            x, norm.weight, norm.bias, norm.running_mean, norm.running_var,
            False, 0.0, norm.eps, out=x, save_mean=x.new_empty(0),
            save_invstd=x.new_empty(0))
        if i == 2:
            return x
        if isinstance(self.act, nn.GELU) and self.act.approximate == 'none':
            return torch.ops.aten.gelu_(x)
        return self.act(x)
