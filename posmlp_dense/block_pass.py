"""The computation of one PosMLP block, on a level's (B, H, W, C) map:

    x + DropPath(proj_c_s(Gate(GELU(proj_c_e(LayerNorm(x))))))

``block_pass`` is the block's one forward. Between the projections the
hidden values are channel-major (2K, B * H * W): the expansion writes them
so, each channel's tokens in map order, and the gate cuts u into windows
with no re-arrangement of the channels (windows.py, token_mixing.py).
Autograd either records these operations one by one, or, where the gate
allows it (``GateUnit.lean_backward``), goes through the lean training
Function of block_function.py, whose forward is this same function.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple, Optional

import torch
import torch.nn.functional as F

from .token_mixing import Mixing, gate_output, mix
from .windows import WindowGrid


@dataclass
class BlockWeights:
    """A block's own parameters (everything but the gate's), and its
    LayerNorm's eps and GELU's form."""
    norm_weight: torch.Tensor
    norm_bias: torch.Tensor
    expand_weight: torch.Tensor     # (2K, C)
    expand_bias: torch.Tensor       # (2K,)
    shrink_weight: torch.Tensor     # (C, K)
    shrink_bias: torch.Tensor       # (C,)
    eps: float
    approximate: str


class BlockPass(NamedTuple):
    """What one pass computes: the block's output and, when asked for, the
    intermediates the lean training Function keeps."""
    output: torch.Tensor                # (B, H, W, C)
    hidden: Optional[torch.Tensor]      # (2K, B * H * W), before GELU
    mixed: Optional[torch.Tensor]       # m' in map order, (K * B, H * W)


def block_pass(x: torch.Tensor, w: BlockWeights, mixing: Mixing,
               grid: WindowGrid, drop_scale: Optional[torch.Tensor] = None,
               gate_input: Optional[Callable] = None,
               keep_intermediates: bool = False) -> BlockPass:
    """The block on a (B, H, W, C) map. ``drop_scale``: stochastic depth's
    per-sample (B,) scale, or None; ``gate_input``: the gate's transform of
    u before the mixing (GateUnit.prepare_input), or None;
    ``keep_intermediates``: also return the pre-activation and m'. Without
    it the pre-activation is freed once activated, and LayerNorm's output
    once expanded, which lowers the peak memory of an inference by a third
    of the block's."""
    B, H, W, C = x.shape
    hidden = torch.addmm(w.expand_bias.unsqueeze(1), w.expand_weight,
                         F.layer_norm(x.reshape(-1, C), (C,), w.norm_weight,
                                      w.norm_bias, w.eps).t())
    u, v = F.gelu(hidden, approximate=w.approximate).view(
        2, -1, B, H, W).unbind(0)
    if not keep_intermediates:
        del hidden
    if gate_input is not None:
        u = gate_input(u)
    mixed = grid.to_map(mix(u, mixing, grid))
    gated = gate_output(mixed, mixing, v)
    out = torch.addmm(w.shrink_bias, gated.reshape(gated.shape[0], -1).t(),
                      w.shrink_weight.t())
    if drop_scale is None:
        out = x + out.view(B, H, W, C)
    else:  # x + s * out, sample by sample, in one pass
        out = torch.addcmul(x, out.view(B, H, W, C),
                            drop_scale.to(out.dtype).view(B, 1, 1, 1))
    if keep_intermediates:
        return BlockPass(out, hidden, mixed)
    return BlockPass(out, None, None)
