"""Architecture settings of PosMLP and their validation.

The published variants (T/S/B) are fixed tables; a custom architecture is a
dict with the same fields. Everything is checked here, once, so that a bad
setting fails with a message naming the field instead of a shape error deep
inside the model.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Sequence, Tuple, Union

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
