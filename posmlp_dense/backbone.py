"""PosMLP as a multi-scale backbone for dense prediction (pure PyTorch)."""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple, Union

import torch
import torch.fx
import torch.nn.functional as F
import torch.utils.checkpoint as cp
from torch import nn
from timm.layers import register_notrace_module, trunc_normal_
from timm.models._features import feature_take_indices

from .archs import LevelSpec, build_level_specs, check_index_range
from .block import PosMLPBlock
from .downsample import ConvDownsample
from .gates import GQPE, LRPE, SGU
from .stem import ConvStem
from .forward_mode import ForwardMode, decide_forward_mode
from .token_mixing import level_mixings
from .windows import WindowGrid, window_grid


# timm's convention for modules FX feature extraction does not trace into:
# a level then runs eagerly inside the traced graph, so FX outputs equal
# eager ones bit for bit.
@register_notrace_module
class PosMLPLevel(nn.Module):
    """Optional downsampling, then blocks that mix tokens inside windows.

    The blocks work on the (B, H, W, C) map; each cuts its gate's input
    into windows for the mixing alone (windows.py). With shifted windows,
    odd blocks use a grid offset by half a window.
    """

    def __init__(self, spec: LevelSpec, prev_dim: Optional[int], gate: str,
                 drop_paths: Sequence[float], shift: bool = False,
                 pos_only: bool = True, generalized: bool = True,
                 with_cp: bool = False):
        super().__init__()
        if prev_dim is not None:
            self.pool = ConvDownsample(prev_dim, spec.dim)
        self.encoder = nn.ModuleList([
            PosMLPBlock(spec, gate, drop_path=drop_paths[j], pos_only=pos_only,
                        generalized=generalized)
            for j in range(spec.depth)])
        self.window = spec.window
        self.shift = shift
        self.with_cp = with_cp

    def grid_origins(self, height, width) -> Tuple[Tuple[int, int], ...]:
        """Where the window grid starts, per block parity: (0, 0), and with
        shifted windows half a window along axes longer than a window (as
        Swin does)."""
        if not self.shift:
            return ((0, 0),)
        origin = tuple(w // 2 if size > w else 0 for size, w in
                       zip((height, width), self.window))
        if origin == (0, 0):
            return ((0, 0),)
        return (0, 0), origin

    def window_grids(self, height, width, gathers: bool = False
                     ) -> Tuple[WindowGrid, ...]:
        """The window grids (windows.py) of a map, one per block parity;
        ``gathers`` in a captured graph (see WindowGrid)."""
        return tuple(window_grid(height, width, self.window, o, gathers)
                     for o in self.grid_origins(height, width))

    def forward(self, x: torch.Tensor,
                mode: Optional[ForwardMode] = None) -> torch.Tensor:
        """(B, H, W, C) map in, (B, H', W', C') map out. ``mode``: as decided
        by PosMLP.forward (forward_mode.py); None (a level called on its own,
        or as an FX leaf) decides it here."""
        if mode is None:
            mode = decide_forward_mode(x)
        if hasattr(self, 'pool'):
            x = self.pool(x)
        if len(self.encoder) == 0:
            return x
        grids = self.window_grids(x.shape[1], x.shape[2], mode.graph)
        block_grids = [grids[j % len(grids)] for j in range(len(self.encoder))]
        # the mixing weights of every block of the fused pass at once: they
        # depend on the parameters and the window only (a block that calls
        # its modules computes its own, in its gate's call)
        fused = [j for j, block in enumerate(self.encoder)
                 if not block.needs_module_calls()]
        mixings = [None] * len(self.encoder)
        if fused:
            for j, mixing in zip(fused, level_mixings(
                    [self.encoder[j].gate_unit for j in fused],
                    [block_grids[j] for j in fused], mode)):
                mixings[j] = mixing
        for block, grid, mixing in zip(self.encoder, block_grids, mixings):
            if self.with_cp and mode.autograd and x.requires_grad:
                x = cp.checkpoint(block, x, grid, mixing, mode,
                                  use_reentrant=False)
            else:
                x = block(x, grid, mixing, mode)
        for grid in grids:
            grid.release_layouts()
        return x


class PosMLP(nn.Module):
    """PosMLP backbone: feature maps at strides 4, 8, 16, 32.

    Args:
        arch: 't', 's', 'b' or a dict with ``embed_dims``, ``depths``,
            ``mlp_ratio``, ``gamma`` and ``window_size`` (one entry per level).
        gate: 'gqpe' (published), 'lrpe', or 'sgu' (gMLP baseline).
        in_channels: input image channels.
        window_size: override the arch's windows: an int, a pair (wh, ww),
            or one entry per level.
        out_indices: levels whose outputs are returned.
        out_norm: apply a LayerNorm (``norm{i}``) to each returned level; with
            False the raw level outputs are returned.
        drop_path_rate: stochastic depth, increasing linearly over blocks.
        pos_only: LRPE only; False adds a learned N x N token matrix.
        gqpe_generalized: GQPE with a full 2x2 spread (published) or the
            isotropic form.
        shift: shifted windows in every second block (off as published).
        ape: absolute position embedding after the stem (off as published),
            learned on an ``ape_grid`` map and resized to the input.
        frozen_stages: -1 trains everything; 0 freezes the stem; k >= 1 also
            freezes levels 0..k-1 and their output norms.
        norm_eval: keep the stem's BatchNorms in eval mode while training.
        with_cp: gradient checkpointing of each block.
        check_finite: raise on NaN/Inf input values (costs a reduction).
    """

    def __init__(self, arch: Union[str, dict] = 't', gate: str = 'gqpe',
                 in_channels: int = 3, window_size=None,
                 out_indices: Sequence[int] = (0, 1, 2, 3),
                 out_norm: bool = True, drop_path_rate: float = 0.1,
                 pos_only: bool = True, gqpe_generalized: bool = True,
                 shift: bool = False, ape: bool = False,
                 ape_grid: Tuple[int, int] = (56, 56),
                 frozen_stages: int = -1, norm_eval: bool = False,
                 with_cp: bool = False, check_finite: bool = False):
        super().__init__()
        specs = build_level_specs(arch, gate, window_size)
        num_levels = len(specs)
        if isinstance(out_indices, int):
            out_indices = (out_indices,)
        out_indices = tuple(out_indices)
        if not out_indices:
            raise ValueError(f'out_indices is empty: name at least one level '
                             f'in [0, {num_levels - 1}] to return')
        check_index_range('out_indices', out_indices, num_levels)
        if len(set(out_indices)) != len(out_indices):
            raise ValueError(f'out_indices names a level more than once: '
                             f'{out_indices!r}')
        if not isinstance(frozen_stages, int) or not (
                -1 <= frozen_stages <= num_levels):
            raise ValueError(f'frozen_stages must be an int in [-1, '
                             f'{num_levels}], got {frozen_stages!r}')
        if not isinstance(in_channels, int) or in_channels <= 0:
            raise ValueError(f'in_channels must be a positive int, got '
                             f'{in_channels!r}')
        if not 0.0 <= drop_path_rate < 1.0:
            raise ValueError(f'drop_path_rate must be in [0, 1), got '
                             f'{drop_path_rate!r}')
        self.specs = specs
        self.gate = gate
        self.in_channels = in_channels
        self.out_indices = out_indices
        self.out_norm = out_norm
        self.frozen_stages = frozen_stages
        self.norm_eval = norm_eval
        self.check_finite = check_finite
        self.embed_dims = tuple(s.dim for s in specs)
        self.num_features = [specs[i].dim for i in out_indices]
        # timm's feature metadata: one entry per level
        self.feature_info = [
            dict(num_chs=s.dim, reduction=4 * 2 ** i, module=f'levels.{i}')
            for i, s in enumerate(specs)]

        self.patch_embed = ConvStem(in_channels, specs[0].dim)
        self.ape_grid = tuple(ape_grid)
        if ape:
            self.absolute_pos_embed = nn.Parameter(
                torch.zeros(1, self.ape_grid[0] * self.ape_grid[1],
                            specs[0].dim))
        else:
            self.absolute_pos_embed = None

        depths = [s.depth for s in specs]
        rates = torch.linspace(0, drop_path_rate, max(sum(depths), 1)).tolist()
        levels, start = [], 0
        for i, spec in enumerate(specs):
            levels.append(PosMLPLevel(
                spec, specs[i - 1].dim if i else None, gate,
                rates[start:start + spec.depth], shift=shift,
                pos_only=pos_only, generalized=gqpe_generalized,
                with_cp=with_cp))
            start += spec.depth
        self.levels = nn.ModuleList(levels)
        if out_norm:
            for i in out_indices:
                self.add_module(f'norm{i}',
                                nn.LayerNorm(specs[i].dim, eps=1e-6))
        self.reset_parameters()
        self._freeze_stages()

    # ----------------------------------------------------------- parameters
    def reset_parameters(self):
        """The published initialization (timm's trunc-normal 0.02 scheme)."""
        self.apply(_init_module)
        for module in self.modules():
            if isinstance(module, (GQPE, LRPE, SGU)):
                module.reset_parameters()
        if self.absolute_pos_embed is not None:
            trunc_normal_(self.absolute_pos_embed, std=0.02)

    def _frozen_modules(self) -> List[nn.Module]:
        if self.frozen_stages < 0:
            return []
        modules = [self.patch_embed]
        for i in range(self.frozen_stages):
            modules.append(self.levels[i])
            if hasattr(self, f'norm{i}'):
                modules.append(getattr(self, f'norm{i}'))
        return modules

    def _freeze_stages(self):
        if self.frozen_stages >= 0 and self.absolute_pos_embed is not None:
            self.absolute_pos_embed.requires_grad_(False)
        for module in self._frozen_modules():
            module.eval()
            for param in module.parameters():
                param.requires_grad_(False)

    def train(self, mode: bool = True):
        super().train(mode)
        self._freeze_stages()
        if mode and self.norm_eval:
            for module in self.modules():
                if isinstance(module, nn.modules.batchnorm._BatchNorm):
                    module.eval()
        return self

    # -------------------------------------------------------------- forward
    def check_input(self, x: torch.Tensor):
        """Raise a clear error for input the model cannot take."""
        if not isinstance(x, torch.Tensor):
            raise TypeError(f'PosMLP expects a torch.Tensor, got {type(x)}')
        if x.dim() != 4:
            raise ValueError(f'PosMLP expects a 4-D (B, C, H, W) batch, got '
                             f'shape {tuple(x.shape)}')
        if x.shape[1] != self.in_channels:
            raise ValueError(f'PosMLP expects {self.in_channels} input '
                             f'channels, got {x.shape[1]} (input shape '
                             f'{tuple(x.shape)})')
        if x.shape[0] == 0 or x.shape[2] == 0 or x.shape[3] == 0:
            raise ValueError(f'PosMLP got an empty input of shape '
                             f'{tuple(x.shape)}')
        if not x.is_floating_point():
            raise TypeError(f'PosMLP expects a floating-point image, got '
                            f'{x.dtype}; convert and normalize it first')
        weight = next(self.patch_embed.parameters())
        if x.device != weight.device:
            raise ValueError(f'PosMLP input is on {x.device} but the model '
                             f'is on {weight.device}; move one of them')
        if x.dtype != weight.dtype and not torch.is_autocast_enabled(
                x.device.type):
            raise TypeError(f'PosMLP input is {x.dtype} but the model '
                            f'weights are {weight.dtype}; cast the input '
                            f'(or the model), or run under torch.autocast')
        if self.check_finite and not bool(torch.isfinite(x).all()):
            bad = int((~torch.isfinite(x)).sum())
            raise ValueError(f'PosMLP input has {bad} non-finite (NaN/Inf) '
                             f'values')

    def position_embedding(self, size: Tuple[int, int]) -> torch.Tensor:
        """(1, H, W, C) absolute position embedding for a stem map of
        ``size``. The (1, gh*gw, C) parameter is viewed as (1, C, gh, gw) by
        a plain reshape, as the published code does, then resized."""
        pe = self.absolute_pos_embed.reshape(1, -1, *self.ape_grid)
        if tuple(size) != self.ape_grid:
            pe = F.interpolate(pe, size=tuple(size), mode='bicubic',
                               align_corners=False)
        return pe.permute(0, 2, 3, 1)

    def level_map_sizes(self, height: int, width: int
                        ) -> List[Tuple[int, int]]:
        """(h, w) of every level's map for an input image of that size."""
        sizes = [ConvStem.output_size(height, width)]
        for _ in range(1, len(self.levels)):
            sizes.append(ConvDownsample.output_size(*sizes[-1]))
        return sizes

    def forward_mode(self, x) -> ForwardMode:
        """How this forward runs (forward_mode.py); decided once per call."""
        return decide_forward_mode(x)

    def forward_intermediates(
            self, x: torch.Tensor,
            indices: Optional[Union[int, Sequence[int]]] = None,
            norm: bool = False, stop_early: bool = False,
            output_fmt: str = 'NCHW', intermediates_only: bool = False):
        """The one forward loop: stem, then the levels in order.

        Follows timm's convention. ``indices``: the levels to return (an int
        n means the last n levels; None: all); out-of-range indices raise.
        ``norm``: apply each returned level's output norm (``norm{i}``, where
        the model has one). ``stop_early``: run no level past the last one
        requested. ``output_fmt``: 'NCHW' or 'NHWC'. Returns the list of
        intermediates, or with ``intermediates_only=False`` the pair (output
        of the last level run, intermediates).
        """
        if output_fmt not in ('NCHW', 'NHWC'):
            raise ValueError(f"output_fmt must be 'NCHW' or 'NHWC', got "
                             f'{output_fmt!r}')
        take, last = feature_take_indices(len(self.levels), indices)
        mode = self.forward_mode(x)
        if not mode.graph:
            self.check_input(x)
        x = self.patch_embed(x)
        if self.absolute_pos_embed is not None:
            x = x + self.position_embedding(x.shape[1:3])
        levels = self.levels[:last + 1] if stop_early else self.levels
        intermediates = []
        # (under FX tracing the levels are leaves that decide at run time)
        level_mode = None if isinstance(x, torch.fx.Proxy) else mode
        for i, level in enumerate(levels):
            x = level(x, level_mode)
            if i in take:
                y = x
                if norm and hasattr(self, f'norm{i}'):
                    y = getattr(self, f'norm{i}')(y)
                intermediates.append(
                    y.permute(0, 3, 1, 2) if output_fmt == 'NCHW' else y)
        if intermediates_only:
            return intermediates
        return (x.permute(0, 3, 1, 2) if output_fmt == 'NCHW' else x,
                intermediates)

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        """The ``out_indices`` levels as contiguous NCHW maps (normalized by
        ``norm{i}`` with ``out_norm``)."""
        outs = self.forward_intermediates(
            x, indices=list(self.out_indices), norm=self.out_norm,
            stop_early=True, intermediates_only=True)
        return tuple(y.contiguous() for y in outs)


def _init_module(module: nn.Module):
    if isinstance(module, (nn.Linear, nn.Conv2d)):
        trunc_normal_(module.weight, std=0.02, a=-2.0, b=2.0)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, (nn.LayerNorm, nn.BatchNorm2d)):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)
