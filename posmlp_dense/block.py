"""One PosMLP block, operating on a window-partitioned token buffer.

    x + DropPath(proj_c_s(Gate(GELU(proj_c_e(LayerNorm(x))))))

Tokens arrive as a flat (T, C) buffer laid out by a WindowPlan; everything
but the gate is per token, and the gate mixes tokens within windows.
"""
from __future__ import annotations

from typing import Optional, Union

import torch
import torch.nn.functional as F
from torch import nn

from .archs import LevelSpec
from .block_function import lean_block_forward
from .gates import build_gate
from .gates.posgu import PoSGU, to_group_major
from .windows import PaddedWindows, WindowPlan
from .workspace import TrainingScratch, Workspace

Windows = Union[WindowPlan, PaddedWindows]


class PosMLPBlock(nn.Module):
    # AUTOGRAD mode with exact windows runs a PoSGU block as one autograd
    # Function that keeps less than half the activations
    # (block_function.py). False: autograd through each operation (the
    # reference the Function is tested against).
    lean_backward = True

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

    def forward(self, x: torch.Tensor, windows: Windows, batch: int,
                workspace: Optional[Workspace] = None,
                scratch: Optional[TrainingScratch] = None,
                last_backward: bool = False) -> torch.Tensor:
        """``x``: the level's token buffer laid out by ``windows`` (a
        WindowPlan, or PaddedWindows in a captured graph). With a
        ``workspace`` (INFERENCE mode, see PosMLPLevel) intermediates go into
        its buffers and ``x`` is updated in place. ``scratch``: the level's
        shared temporaries for the lean training Function, which the block
        whose backward runs last (``last_backward``) releases."""
        if workspace is not None:
            return self._forward_in_place(x, windows, batch, workspace)
        if self._runs_lean(windows):
            return lean_block_forward(
                self, x, windows.runs(batch),
                self._drop_path_scale(x, windows, batch), scratch,
                last_backward)
        w_e, b_e, w_s = self._projections()
        hidden = self.act(F.linear(self.norm(x), w_e, b_e))
        gated = self.gate_unit(hidden, windows if isinstance(
            windows, PaddedWindows) else windows.runs(batch))
        out = F.linear(gated, w_s, self.proj_c_s.bias)
        scale = self._drop_path_scale(x, windows, batch)
        if scale is not None:
            out = out * scale
        return x + out

    def _runs_lean(self, windows) -> bool:
        return (self.lean_backward and isinstance(windows, WindowPlan)
                and type(self.gate_unit) is PoSGU
                and type(self.act) is nn.GELU)

    def _drop_path_scale(self, x, windows, batch) -> Optional[torch.Tensor]:
        """Stochastic depth: a (T, 1) per-sample scale (0 or 1/keep), or
        None when no sample is dropped."""
        if not (self.training and self.drop_path > 0):
            return None
        keep = 1.0 - self.drop_path
        mask = x.new_empty(batch).bernoulli_(keep).div_(keep)
        # samples are spread over windows
        return windows.per_sample(mask)

    def _forward_in_place(self, x, plan, batch, workspace):
        """The block run by run (``workspace.max_rows`` rows at most): with
        short runs every intermediate stays in the CPU caches."""
        C = x.shape[1]
        w_e, b_e, w_s = self._projections()
        norm = self.norm
        exact_gelu = isinstance(self.act, nn.GELU) and \
            self.act.approximate == 'none'
        for run in plan.runs(batch, workspace.max_rows):
            rows = x[run.start:run.start + run.rows]
            normed = workspace.get('normed', (run.rows, C), x)
            torch.ops.aten.native_layer_norm.out(
                rows, [C], norm.weight, norm.bias, norm.eps, out0=normed,
                out1=workspace.get('mean', (run.rows, 1), x),
                out2=workspace.get('rstd', (run.rows, 1), x))
            # channel-major (token_mixing.py): the mixing then multiplies
            # each group's channels as they lie
            hidden = workspace.get('hidden', (w_e.shape[0], run.rows), x)
            torch.addmm(b_e.view(-1, 1), w_e, normed.t(), out=hidden)
            hidden = torch.ops.aten.gelu_(hidden) if exact_gelu \
                else self.act(hidden)
            gated = self.gate_unit.forward_channel_major(hidden, run,
                                                         workspace)
            # the residual, in place (the out= form, which flop counters see)
            torch.addmm(rows, gated.t(), w_s.t(), out=rows)
            rows.add_(self.proj_c_s.bias)
        return x

    def _projections(self):
        """proj_c_e's weight and bias and proj_c_s's weight, with the gate's
        channels in the order the gate reads them (group-major, see
        GateUnit.group_major). A permutation of the weights per forward:
        cheap next to a re-arrangement of the activations."""
        w_e, b_e = self.proj_c_e.weight, self.proj_c_e.bias
        w_s = self.proj_c_s.weight
        if not self.gate_unit.group_major:
            return w_e, b_e, w_s
        return to_group_major(w_e, b_e, w_s, self.gate_unit.groups)

    def extra_repr(self) -> str:
        return f'drop_path={self.drop_path}'
