"""mmseg's ``Upsample`` with an output size that stays symbolic in export.

mmseg's ``Upsample`` (used by Semantic FPN's head, among others) computes
its output size as ``int(size * 2.0)``. Under ``torch.export`` the float
product and ``int()`` fix that size to the example's: ``torch.export``
keeps it as a runtime assertion (its program fails at other sizes), and the
ONNX file, which has no assertions, silently upsamples every input to the
example's size before the head resizes it back, so its logits are wrong at
every other size. For a whole-number factor, ``size * 2`` is the same
number and stays symbolic: ``SymbolicUpsample`` computes exactly what
mmseg's module computes, and ``make_upsampling_symbolic`` swaps it in.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SymbolicUpsample(nn.Module):
    """Same output as the mmseg ``Upsample`` it replaces (whole-number
    factor, no fixed size), with the size computed in integers."""

    def __init__(self, upsample: nn.Module):
        super().__init__()
        self.factor = int(upsample.scale_factor)
        self.mode = upsample.mode
        self.align_corners = upsample.align_corners

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        height, width = x.shape[-2:]
        # mmseg's resize() calls F.interpolate with these arguments (its
        # extra code only warns, and would read the sizes with int())
        return F.interpolate(x, (height * self.factor, width * self.factor),
                             None, self.mode, self.align_corners)

    def extra_repr(self) -> str:
        return (f'factor={self.factor}, mode={self.mode!r}, '
                f'align_corners={self.align_corners}')


def make_upsampling_symbolic(model: nn.Module) -> int:
    """Replace, in place, every mmseg ``Upsample`` that a whole-number factor
    defines by a ``SymbolicUpsample``; returns how many were replaced.

    Others (a fixed size, a fractional or per-axis factor) are left as they
    are; verification in ONNX Runtime shows whether they export correctly.
    """
    from mmseg.models.utils import Upsample
    replaced = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            factor = getattr(child, 'scale_factor', None)
            if (type(child) is Upsample and not child.size
                    and isinstance(factor, float) and factor.is_integer()):
                setattr(parent, name, SymbolicUpsample(child))
                replaced += 1
    return replaced
