"""One PosMLP block, operating on a window-partitioned token buffer.

    x + DropPath(proj_c_s(Gate(GELU(proj_c_e(LayerNorm(x))))))

Tokens arrive as a flat (T, C) buffer laid out by a WindowPlan; everything
but the gate is per token, and the gate mixes tokens within windows.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from .archs import LevelSpec
from .gates import build_gate
from .windows import WindowPlan
from .workspace import Workspace


class PosMLPBlock(nn.Module):

    def __init__(self, spec: LevelSpec, gate: str, drop_path: float = 0.0,
                 pos_only: bool = True, generalized: bool = True,
                 norm_eps: float = 1e-6):
        super().__init__()
        self.norm = nn.LayerNorm(spec.dim, eps=norm_eps)
        self.proj_c_e = nn.Linear(spec.dim, spec.hidden)
        self.act = nn.GELU()
        self.gate_unit = build_gate(gate, spec.gate_channels, spec.window,
                                    spec.gamma, pos_only=pos_only,
                                    generalized=generalized)
        self.proj_c_s = nn.Linear(spec.gate_channels, spec.dim)
        self.drop_path = drop_path

    def forward(self, x: torch.Tensor, plan: WindowPlan, batch: int,
                workspace: Optional[Workspace] = None) -> torch.Tensor:
        """With a ``workspace`` (inference, see PosMLPLevel) intermediates go
        into its buffers and ``x``, the level's own token buffer, is updated
        in place."""
        if workspace is not None:
            return self._forward_in_place(x, plan, batch, workspace)
        hidden = self.proj_c_e(self.norm(x))
        # the gate applies the GELU, fused with its own passes in inference
        out = self.proj_c_s(self.gate_unit(hidden, plan, batch, self.act))
        if self.training and self.drop_path > 0:
            # stochastic depth per sample; samples are spread over windows
            keep = 1.0 - self.drop_path
            mask = x.new_empty(batch).bernoulli_(keep).div_(keep)
            out = out * plan.per_sample(mask)
        return x + out

    def _forward_in_place(self, x, plan, batch, workspace):
        T, C = x.shape
        normed = workspace.get('normed', (T, C), x)
        torch.ops.aten.native_layer_norm.out(
            x, [C], self.norm.weight, self.norm.bias, self.norm.eps,
            out0=normed, out1=workspace.get('mean', (T, 1), x),
            out2=workspace.get('rstd', (T, 1), x))
        proj = self.proj_c_e
        hidden = workspace.get('hidden', (T, proj.out_features), x)
        torch.addmm(proj.bias, normed, proj.weight.t(), out=hidden)
        gated = self.gate_unit(hidden, plan, batch, self.act, workspace)
        # the residual, in place (the out= form, which flop counters see)
        torch.addmm(x, gated, self.proj_c_s.weight.t(), out=x)
        return x.add_(self.proj_c_s.bias)

    def extra_repr(self) -> str:
        return f'drop_path={self.drop_path}'
