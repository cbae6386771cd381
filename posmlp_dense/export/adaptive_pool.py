"""Adaptive average pooling that the ONNX export keeps right at every size.

``torch.export`` captures ``nn.AdaptiveAvgPool2d`` with symbolic sizes, but
the ONNX converter writes it for the example's size only (gathers with
fixed indices): the file then fails or is wrong at other sizes. UperNet's
pyramid pooling (PPM: 1, 2, 3 and 6 bins) is the case in mmseg.

``SymbolicAdaptiveAvgPool2d`` computes the same bins as PyTorch (bin i of
n inputs into k covers [floor(i n / k), ceil((i + 1) n / k))) from index
arithmetic on the symbolic size: along each axis a (k, n) averaging matrix
is built and applied with a matmul, so every output is the mean of its bin
up to float rounding.
"""
from __future__ import annotations

import torch
from torch import nn


def _bin_means(n, k: int, like: torch.Tensor) -> torch.Tensor:
    """(k, n) matrix whose row i averages PyTorch's adaptive bin i."""
    i = torch.arange(k, device=like.device)
    start = (i * n) // k
    end = ((i + 1) * n + k - 1) // k
    j = torch.arange(n, device=like.device)
    member = (j[None, :] >= start[:, None]) & (j[None, :] < end[:, None])
    member = member.to(like.dtype)
    return member / member.sum(dim=1, keepdim=True)


class SymbolicAdaptiveAvgPool2d(nn.Module):
    """``nn.AdaptiveAvgPool2d`` with whole-number output sizes, computed
    with matmuls against bin-averaging matrices."""

    def __init__(self, output_size):
        super().__init__()
        if isinstance(output_size, int):
            output_size = (output_size, output_size)
        self.output_size = tuple(int(s) for s in output_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = _bin_means(x.size(-2), self.output_size[0], x)
        cols = _bin_means(x.size(-1), self.output_size[1], x)
        return rows @ x @ cols.t()

    def extra_repr(self) -> str:
        return f'output_size={self.output_size}'


def make_adaptive_pooling_symbolic(model: nn.Module) -> int:
    """Replace, in place, every ``nn.AdaptiveAvgPool2d`` whose output size
    is given in full (no ``None``) by a ``SymbolicAdaptiveAvgPool2d``;
    returns how many were replaced."""
    replaced = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is not nn.AdaptiveAvgPool2d:
                continue
            size = child.output_size
            sizes = (size, size) if isinstance(size, int) else tuple(size)
            if all(isinstance(s, int) for s in sizes):
                setattr(parent, name, SymbolicAdaptiveAvgPool2d(sizes))
                replaced += 1
    return replaced
