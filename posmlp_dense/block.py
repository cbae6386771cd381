"""One PosMLP block (``levels.i.encoder.j``): its modules, and the choice
of how a forward runs them. The fused pass (block_pass.py says what it
computes) reads their weights, with autograd through each operation or
through the lean training Function; where a hook or a swapped module
needs the modules called (module_calls.py), the block calls them."""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from .archs import LevelSpec
from .block_function import lean_block
from .block_pass import BlockWeights, block_pass
from .forward_mode import ForwardMode, decide_forward_mode
from .gates import GateUnit, build_gate
from .module_calls import must_call
from .token_mixing import Mixing, level_mixings
from .windows import WindowGrid


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

    def weights(self) -> BlockWeights:
        return BlockWeights(self.norm.weight, self.norm.bias,
                            self.proj_c_e.weight, self.proj_c_e.bias,
                            self.proj_c_s.weight, self.proj_c_s.bias,
                            self.norm.eps, self.act.approximate)

    def needs_module_calls(self) -> bool:
        """Whether a forward must call the block's modules (a hook, or a
        module swapped for another class) instead of the fused pass."""
        return must_call((self.norm, nn.LayerNorm), (self.proj_c_e, nn.Linear),
                         (self.act, nn.GELU), (self.proj_c_s, nn.Linear)) \
            or not isinstance(self.gate_unit, GateUnit) \
            or self.gate_unit.needs_module_calls()

    def forward(self, x: torch.Tensor, grid: WindowGrid,
                mixing: Optional[Mixing] = None,
                mode: Optional[ForwardMode] = None) -> torch.Tensor:
        """``x``: a (B, H, W, C) map cut into windows by ``grid``.
        ``mixing``: this block's operands for that grid, as its level
        computes them for the blocks of the fused pass at once (None:
        computed here). ``mode``: as decided by PosMLP.forward (None:
        decided here)."""
        if mode is None:
            mode = decide_forward_mode(x)
        drop_scale = self._drop_path_scale(x)
        if mixing is None:
            # (a level gives mixing operands only to the blocks it found
            # need no module calls, so that check is made once)
            if self.needs_module_calls():
                return self.forward_through_modules(x, grid, drop_scale)
            mixing = level_mixings([self.gate_unit], [grid], mode)[0]
        if mode.autograd and self.gate_unit.lean_backward:
            return lean_block(x, self.weights(), mixing, grid, drop_scale)
        return block_pass(x, self.weights(), mixing, grid, drop_scale,
                          self.gate_unit.prepare_input).output

    def forward_through_modules(self, x: torch.Tensor, grid: WindowGrid,
                                drop_scale: Optional[torch.Tensor] = None
                                ) -> torch.Tensor:
        """The block as a chain of module calls, token-major throughout:
        block_pass's computation, with plain autograd."""
        hidden = self.act(self.proj_c_e(self.norm(x)))
        u, v = hidden.chunk(2, dim=-1)
        out = self.proj_c_s(self.gate_unit(u, v, grid))
        if drop_scale is not None:
            out = out * drop_scale.to(out.dtype).view(-1, 1, 1, 1)
        return x + out

    def _drop_path_scale(self, x) -> Optional[torch.Tensor]:
        """Stochastic depth: a per-sample (B,) scale, 0 or 1/keep, or None
        when no sample can be dropped."""
        if not (self.training and self.drop_path > 0):
            return None
        keep = 1.0 - self.drop_path
        # drawn by torch.rand, which a compiler generates inside the kernel
        # that uses the draw (bernoulli_ stays a library call of its own);
        # float32, since every user casts it to its output's dtype
        return (torch.rand(x.shape[0], device=x.device) < keep) / keep

    def extra_repr(self) -> str:
        return f'drop_path={self.drop_path}'
