"""Architecture settings of PosMLP and their validation.

The published variants (T/S/B) are fixed tables; a custom architecture is a
dict with the same fields. Everything is checked here, once, so that a bad
setting fails with a message naming the field instead of a shape error deep
inside the model.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, Mapping, Sequence, Tuple, Union

import torch

from .errors import CheckpointError
from .relative_position import infer_window

GATES = ('gqpe', 'lrpe', 'sgu')

# Largest window side we accept. The mixing matrices grow as side**4, and a
# window of 64 already means 4096 x 4096 per group; anything bigger is almost
# certainly a typo (e.g. a pixel size passed instead of a token count).
MAX_WINDOW_SIDE = 64

ARCH_SETTINGS: Dict[str, dict] = {
    't': dict(embed_dims=(96, 192, 384, 768), depths=(2, 2, 18, 2),
              mlp_ratio=(4, 4, 4, 2), gamma=(8, 16, 32, 64),
              window_size=(14, 14, 14, 7)),
    's': dict(embed_dims=(128, 256, 512, 1024), depths=(2, 2, 18, 2),
              mlp_ratio=(4, 4, 4, 2), gamma=(8, 16, 32, 64),
              window_size=(14, 14, 14, 7)),
    'b': dict(embed_dims=(192, 384, 768, 1536), depths=(2, 2, 18, 2),
              mlp_ratio=(4, 4, 4, 2), gamma=(8, 16, 32, 64),
              window_size=(14, 14, 14, 7)),
}
_ARCH_ALIASES = {'tiny': 't', 'small': 's', 'base': 'b',
                 'posmlp_t': 't', 'posmlp_s': 's', 'posmlp_b': 'b'}
_ARCH_FIELDS = ('embed_dims', 'depths', 'mlp_ratio', 'gamma', 'window_size')


@dataclass(frozen=True)
class LevelSpec:
    """Everything one level of the hierarchy needs to know."""
    dim: int
    depth: int
    mlp_ratio: float
    gamma: int
    window: Tuple[int, int]  # (wh, ww) in tokens

    @property
    def hidden(self) -> int:
        # int() as in the published code: hidden = int(mlp_ratio * dim)
        return int(self.mlp_ratio * self.dim)

    @property
    def gate_channels(self) -> int:
        return self.hidden // 2


def _as_window(value, where: str) -> Tuple[int, int]:
    if isinstance(value, int) and not isinstance(value, bool):
        pair = (value, value)
    elif isinstance(value, (tuple, list)) and len(value) == 2 and all(
            isinstance(v, int) and not isinstance(v, bool) for v in value):
        pair = (int(value[0]), int(value[1]))
    else:
        raise ValueError(f'{where}: a window size must be an int or a pair '
                         f'(wh, ww) of ints, got {value!r}')
    for side in pair:
        if side <= 0:
            raise ValueError(f'{where}: window size must be positive, '
                             f'got {value!r}')
        if side > MAX_WINDOW_SIDE:
            raise ValueError(
                f'{where}: window side {side} is larger than the maximum '
                f'{MAX_WINDOW_SIDE} tokens (mixing matrices grow with the '
                f'fourth power of the side); window sizes count tokens of '
                f'the level, not pixels')
    return pair


def resolve_arch(arch: Union[str, dict]) -> dict:
    """Return the arch dict for a name or validate a custom dict's fields."""
    if isinstance(arch, str):
        key = _ARCH_ALIASES.get(arch.lower(), arch.lower())
        if key not in ARCH_SETTINGS:
            raise KeyError(
                f'unknown PosMLP arch {arch!r}; expected one of '
                f'{sorted(ARCH_SETTINGS)} (or aliases {sorted(_ARCH_ALIASES)})'
                f' or a dict with fields {list(_ARCH_FIELDS)}')
        return dict(ARCH_SETTINGS[key])
    if not isinstance(arch, dict):
        raise TypeError(f'arch must be a name or a dict, got {type(arch)}')
    missing = [f for f in _ARCH_FIELDS if f not in arch]
    unknown = [f for f in arch if f not in _ARCH_FIELDS]
    if missing:
        raise KeyError(f'custom arch dict is missing field(s) {missing}; '
                       f'it needs {list(_ARCH_FIELDS)}')
    if unknown:
        raise KeyError(f'custom arch dict has unknown field(s) {unknown}; '
                       f'allowed: {list(_ARCH_FIELDS)}')
    return dict(arch)


def build_level_specs(arch: Union[str, dict], gate: str,
                      window_size=None) -> Tuple[LevelSpec, ...]:
    """Validate an architecture and return one LevelSpec per level.

    ``window_size`` overrides the arch's windows: an int or (wh, ww) for all
    levels, or a sequence with one entry per level.
    """
    if gate not in GATES:
        raise ValueError(f'unknown gate {gate!r}; expected one of {GATES}')
    cfg = resolve_arch(arch)
    fields = {}
    for name in ('embed_dims', 'depths', 'mlp_ratio', 'gamma'):
        value = cfg[name]
        if not isinstance(value, (list, tuple)) or len(value) == 0:
            raise ValueError(f'arch field {name!r} must be a non-empty list, '
                             f'got {value!r}')
        fields[name] = tuple(value)
    num_levels = len(fields['embed_dims'])
    windows = cfg['window_size'] if window_size is None else window_size
    if isinstance(windows, int) or (isinstance(windows, (tuple, list))
                                    and len(windows) == 2
                                    and all(isinstance(w, int)
                                            for w in windows)
                                    and num_levels != 2):
        windows = (windows,) * num_levels
    if not isinstance(windows, (tuple, list)):
        raise ValueError(f'window_size must be an int, a pair or a list with '
                         f'one entry per level, got {windows!r}')
    fields['window_size'] = tuple(windows)
    for name, value in fields.items():
        if len(value) != num_levels:
            raise ValueError(
                f'arch fields disagree on the number of levels: embed_dims '
                f'has {num_levels} entries but {name!r} has {len(value)} '
                f'({value!r})')
    specs = []
    for i in range(num_levels):
        dim, depth = fields['embed_dims'][i], fields['depths'][i]
        ratio, gamma = fields['mlp_ratio'][i], fields['gamma'][i]
        if not isinstance(dim, int) or dim <= 0:
            raise ValueError(f'embed_dims[{i}] must be a positive int, '
                             f'got {dim!r}')
        if not isinstance(depth, int) or depth < 0:
            raise ValueError(f'depths[{i}] must be an int >= 0, '
                             f'got {depth!r}')
        if not isinstance(ratio, (int, float)) or ratio <= 0:
            raise ValueError(f'mlp_ratio[{i}] must be positive, got {ratio!r}')
        if not isinstance(gamma, int) or gamma <= 0:
            raise ValueError(f'gamma[{i}] must be a positive int, '
                             f'got {gamma!r}')
        if i > 0 and dim % fields['embed_dims'][i - 1] != 0:
            raise ValueError(
                f'embed_dims[{i}]={dim} must be a multiple of '
                f'embed_dims[{i - 1}]={fields["embed_dims"][i - 1]}: the '
                f'downsampling conv is grouped by the previous width')
        if i == 0 and dim % 2 != 0:
            raise ValueError(f'embed_dims[0]={dim} must be even (the stem '
                             f'first maps to embed_dims[0] // 2 channels)')
        spec = LevelSpec(dim=dim, depth=depth, mlp_ratio=ratio, gamma=gamma,
                         window=_as_window(fields['window_size'][i],
                                           f'window_size[{i}]'))
        if spec.hidden % 2 != 0:
            raise ValueError(
                f'level {i}: int(mlp_ratio * dim) = {spec.hidden} must be '
                f'even, the gate splits it into two halves')
        if gate != 'sgu' and spec.gate_channels % gamma != 0:
            raise ValueError(
                f'level {i}: gamma={gamma} must divide the gate channels '
                f'int(mlp_ratio * dim) / 2 = {spec.gate_channels}')
        specs.append(spec)
    return tuple(specs)


def check_index_range(name: str, values: Sequence[int], num_levels: int):
    for v in values:
        if not isinstance(v, int) or not 0 <= v < num_levels:
            raise ValueError(f'{name} entries must be ints in [0, '
                             f'{num_levels - 1}], got {tuple(values)!r}')


# ------------------------------------------------- architecture from weights
def describe_weights(state: Mapping[str, torch.Tensor]) -> dict:
    """Gate, depths and widths of PosMLP weights, for error messages."""
    depths: Dict[int, int] = {}
    for key in state:
        m = re.match(r'levels\.(\d+)\.encoder\.(\d+)\.', key)
        if m:
            level, block = int(m.group(1)), int(m.group(2))
            depths[level] = max(depths.get(level, 0), block + 1)
    if any(k.endswith('attention_centers') for k in state):
        gate = 'gqpe'
    elif any(k.endswith('relative_position_bias_table') for k in state):
        gate = 'lrpe'
    elif any('proj_list' in k for k in state):
        gate = 'sgu'
    else:
        gate = 'unknown'
    dims = [tuple(v.shape)[0] for k, v in sorted(state.items())
            if re.fullmatch(r'levels\.\d+\.encoder\.0\.norm\.weight', k)]
    return dict(gate=gate, depths=tuple(depths[i] for i in sorted(depths)),
                embed_dims=tuple(dims))


def infer_config(state: Mapping[str, torch.Tensor]) -> dict:
    """Model options that rebuild the architecture of some PosMLP weights.

    Returns ``dict(arch=..., gate=..., pos_only=..., gqpe_generalized=...,
    in_channels=..., ape=...)`` for ``PosMLP(**config)`` (backbone or
    classifier weights, prefix already stripped).
    """
    if 'patch_embed.projs.2.weight' not in state:
        raise CheckpointError('not PosMLP weights: no patch_embed.projs.2')
    desc = describe_weights(state)
    levels = sorted({int(m.group(1)) for k in state
                     for m in [re.match(r'levels\.(\d+)\.', k)] if m})
    if not levels or levels != list(range(len(levels))):
        raise CheckpointError(f'not PosMLP weights: levels {levels}')
    dims, depths, ratios, gammas, windows = [], [], [], [], []
    for i in levels:
        if i == 0:
            dim = state['patch_embed.projs.2.weight'].shape[0]
        else:
            dim = state[f'levels.{i}.pool.conv.weight'].shape[0]
        depth = sum(1 for k in state
                    if re.fullmatch(rf'levels\.{i}\.encoder\.\d+\.norm\.weight',
                                    k))
        if depth == 0:
            raise CheckpointError(f'level {i} has no blocks; cannot infer '
                                  f'its gate settings')
        blk = f'levels.{i}.encoder.0.'
        hidden = state[blk + 'proj_c_e.weight'].shape[0]
        if desc['gate'] == 'gqpe':
            gamma = state[blk + 'gate_unit.pos.attention_centers'].shape[0]
        elif desc['gate'] == 'lrpe':
            gamma = state[blk + 'gate_unit.pos.'
                          'window_relative_position_bias_table'].shape[1]
        else:
            gamma = 1
        if desc['gate'] == 'sgu':
            n = state[blk + 'gate_unit.proj_list.0.weight'].shape[0]
            window = infer_window(n)
        else:
            n = state[blk + 'gate_unit.pos.token_proj_n_bias'].numel()
            table = state.get(blk + 'gate_unit.pos.'
                              'window_relative_position_bias_table')
            window = infer_window(n, None if table is None else table.shape[0])
        ratio = hidden / dim
        dims.append(dim)
        depths.append(depth)
        ratios.append(int(ratio) if ratio == int(ratio) else ratio)
        gammas.append(gamma)
        windows.append(window if window[0] != window[1] else window[0])
    spreads = [v for k, v in state.items() if k.endswith('attention_spreads')]
    return dict(
        arch=dict(embed_dims=tuple(dims), depths=tuple(depths),
                  mlp_ratio=tuple(ratios), gamma=tuple(gammas),
                  window_size=tuple(windows)),
        gate=desc['gate'],
        pos_only=not any(k.endswith('token_proj_n_weight') for k in state),
        gqpe_generalized=not spreads or spreads[0].dim() == 3,
        in_channels=state['patch_embed.projs.0.weight'].shape[1],
        ape='absolute_pos_embed' in state)
