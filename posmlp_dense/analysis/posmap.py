"""What the positional gating learned: model-side analysis for pictures.

Everything here is plain torch (no plotting); ``tools/visualize_posmap.py``
draws what these functions return, and the tests check them.

* Loading: :func:`load_backbone` rebuilds a PosMLP from any checkpoint this
  package reads (released, converted, mmdet/mmseg training checkpoints).
* Mixing maps: :func:`query_maps` takes one query's row of every group's
  mixing matrix straight from ``gate_unit.mixing_matrices`` (the very
  matrices the forward pass uses) and lays it out over the window.
* Summaries: :func:`group_summaries` says, per group, where the group looks
  (centre offset) and how far (spread); for GQPE analytically from the
  Gaussian's parameters, otherwise from the moments of the drawn map.
* Resizing: :func:`resized_gate` builds the same gate for another window and
  loads the original weights into it, so the model's own load hook resizes
  them exactly as it would for a checkpoint.
* Effective receptive field: :func:`effective_receptive_field` (gradient of
  one output token with respect to the image) and
  :func:`theoretical_reach` (the pixels that token can depend on at all,
  derived from the convs and the window grids of every level below it).

Offsets are reported in *image* orientation throughout: ``(oy, ox)`` with
``oy`` pointing down and ``ox`` pointing right, in tokens of the level.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch
from torch import nn

from ..backbone import PosMLP
from ..checkpoint import (extract_state_dict, infer_config, load_state,
                         read_checkpoint, strip_prefix)
from ..gates import GQPE, SGU, GateUnit, PoSGU

Rect = Tuple[int, int, int, int]

# ImageNet statistics, used to normalize images for the ERF.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


# ------------------------------------------------------------------ loading
@dataclass
class LoadedBackbone:
    model: PosMLP
    config: dict
    entry: str
    prefix: str
    source: str


def load_backbone(path: str, which: str = 'ema', prefix: Optional[str] = None,
                  shift: bool = False) -> LoadedBackbone:
    """Rebuild a PosMLP backbone (eval mode) from a checkpoint file.

    The architecture is inferred from the weights; a model prefix such as
    ``backbone.`` is found automatically. Output norms (``norm0`` ...) and
    classifier keys are not needed for the pictures and are left out.
    ``shift`` (shifted windows) has no weights and cannot be inferred: pass
    it when the checkpoint was trained with it.
    """
    ckpt = read_checkpoint(path)
    state, entry = extract_state_dict(ckpt, which)
    state, found = strip_prefix(state, prefix)
    config = infer_config(state)
    state = {k: v for k, v in state.items() if not re.match(r'norm\d+\.', k)}
    model = PosMLP(**config, out_norm=False, drop_path_rate=0.0, shift=shift)
    load_state(model, state, source=str(path), entry=entry, prefix=found,
               strict=True)
    model.eval()
    return LoadedBackbone(model, config, entry, found, str(path))


# ------------------------------------------------------------------- blocks
def get_gate(model: PosMLP, level: int, block: int) -> GateUnit:
    """The gate unit of ``model.levels[level].encoder[block]``, checked."""
    levels = len(model.levels)
    if not isinstance(level, int) or not 0 <= level < levels:
        raise IndexError(f'level {level} does not exist: the model has '
                         f'{levels} levels (0..{levels - 1})')
    depth = len(model.levels[level].encoder)
    if depth == 0:
        raise IndexError(f'level {level} has no blocks, so no gate to show')
    if not isinstance(block, int) or not 0 <= block < depth:
        raise IndexError(f'block {block} does not exist: level {level} has '
                         f'{depth} blocks (0..{depth - 1})')
    return model.levels[level].encoder[block].gate_unit


def gate_kind(gate: GateUnit) -> str:
    """'gqpe', 'lrpe' or 'sgu'."""
    if isinstance(gate, SGU):
        return 'sgu'
    if isinstance(gate, PoSGU):
        return 'gqpe' if isinstance(gate.pos, GQPE) else 'lrpe'
    raise TypeError(f'not a PosMLP gate unit: {type(gate).__name__}')


def centre_query(window: Tuple[int, int]) -> Tuple[int, int]:
    return (window[0] - 1) // 2, (window[1] - 1) // 2


def full_rect(window: Tuple[int, int]) -> Rect:
    return 0, window[0], 0, window[1]


def check_query(query: Tuple[int, int], window: Tuple[int, int],
                rect: Optional[Rect] = None) -> Tuple[Rect, Tuple[int, int]]:
    """Validate a query (y, x) and an in-window rectangle of real tokens."""
    wh, ww = window
    rect = full_rect(window) if rect is None else tuple(int(v) for v in rect)
    if len(rect) != 4:
        raise ValueError(f'a window rectangle is (r0, r1, c0, c1), got {rect}')
    r0, r1, c0, c1 = rect
    if not (0 <= r0 < r1 <= wh and 0 <= c0 < c1 <= ww):
        raise ValueError(f'rectangle rows {r0}:{r1}, cols {c0}:{c1} is not '
                         f'inside the {wh}x{ww} window')
    qy, qx = (int(v) for v in query)
    if not (0 <= qy < wh and 0 <= qx < ww):
        raise ValueError(f'query (y={qy}, x={qx}) is outside the {wh}x{ww} '
                         f'window: y must be in 0..{wh - 1}, x in '
                         f'0..{ww - 1}')
    if not (r0 <= qy < r1 and c0 <= qx < c1):
        raise ValueError(f'query (y={qy}, x={qx}) is not one of the real '
                         f'tokens rows {r0}:{r1}, cols {c0}:{c1}')
    return rect, (qy, qx)


# -------------------------------------------------------------- mixing maps
@dataclass
class QueryMaps:
    """One query's mixing weights, laid out over the window.

    ``weights`` is (groups, wh, ww): entry [g, y, x] is the weight group g
    gives the key at in-window (y, x); NaN where the rectangle of real
    tokens leaves no key. ``bias`` is the per-query bias added after mixing.
    """
    kind: str
    window: Tuple[int, int]
    rect: Rect
    query: Tuple[int, int]
    weights: torch.Tensor
    bias: float

    @property
    def groups(self) -> int:
        return self.weights.shape[0]

    def offsets(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """(wh, ww) grids of the key offsets (oy down, ox right)."""
        ys = torch.arange(self.window[0], dtype=torch.float64) - self.query[0]
        xs = torch.arange(self.window[1], dtype=torch.float64) - self.query[1]
        return torch.meshgrid(ys, xs, indexing='ij')


@torch.no_grad()
def query_maps(gate: GateUnit, query: Optional[Tuple[int, int]] = None,
               rect: Optional[Rect] = None) -> QueryMaps:
    """Row ``query`` of the gate's own mixing matrices for a window rectangle.

    ``rect`` = (r0, r1, c0, c1) selects the real tokens of a partial window
    (the default is the full window); the matrices come from
    ``gate.mixing_matrices(rect)``, the call the forward pass makes.
    """
    window = tuple(gate.window)
    query = centre_query(window) if query is None else query
    rect, (qy, qx) = check_query(query, window, rect)
    r0, r1, c0, c1 = rect
    mix, bias = gate.mixing_matrices(rect)
    h, w = r1 - r0, c1 - c0
    row = (qy - r0) * w + (qx - c0)
    weights = torch.full((mix.shape[0], *window), float('nan'),
                         dtype=torch.float64)
    weights[:, r0:r1, c0:c1] = mix[:, row, :].reshape(-1, h, w).double().cpu()
    return QueryMaps(kind=gate_kind(gate), window=window, rect=rect,
                     query=(qy, qx), weights=weights,
                     bias=float(bias[row]))


# ---------------------------------------------------------------- summaries
@dataclass
class GroupSummary:
    """Where one group looks, in tokens, image orientation (oy down)."""
    group: int
    centre: Tuple[float, float]          # (oy, ox)
    cov: Tuple[Tuple[float, float], Tuple[float, float]]  # in (oy, ox)
    source: str                          # 'gaussian' or 'map'
    peaked: bool = True                  # GQPE: a proper Gaussian?
    map_centre: Tuple[float, float] = (0.0, 0.0)
    map_cov: Tuple[Tuple[float, float], Tuple[float, float]] = (
        (0.0, 0.0), (0.0, 0.0))

    @property
    def std_axes(self) -> Tuple[float, float]:
        """Standard deviations along the two principal axes (major first)."""
        vals = torch.linalg.eigvalsh(torch.tensor(self.cov,
                                                  dtype=torch.float64))
        vals = vals.clamp(min=0).sqrt().tolist()
        return vals[1], vals[0]

    def as_dict(self) -> dict:
        major, minor = self.std_axes
        return dict(group=self.group, centre_oy=self.centre[0],
                    centre_ox=self.centre[1], cov=[list(r) for r in self.cov],
                    std_major=major, std_minor=minor, source=self.source,
                    peaked=self.peaked, map_centre_oy=self.map_centre[0],
                    map_centre_ox=self.map_centre[1])


def gqpe_gaussians(pos: GQPE) -> Tuple[torch.Tensor, torch.Tensor,
                                       torch.Tensor]:
    """Each group's Gaussian, read off the module's own score coefficients.

    GQPE's score is a quadratic in the offsets v = (dx, dy) of
    ``gqpe.py`` (dx = xn - xm right, dy = ym - yn *up*):

        score(v) = l . v + 1/2 v^T H v + const

    With the precision K = -H positive definite this is the log-density of
    a Gaussian with mean K^-1 l and covariance K^-1 (in the generalized,
    symmetric form l = S delta and K = S, so the mean is delta itself).
    Returns ``(centre, cov, peaked)`` in image orientation (oy, ox), oy = -dy:
    centre (groups, 2), cov (groups, 2, 2), peaked (groups,) bool.
    """
    coef = pos.score_coefficients().detach().double().cpu()
    lin = coef[:, :2]                      # linear terms of (dx, dy)
    form = coef[:, 2:6].view(-1, 2, 2)     # score = l . v - v^T S v / 2
    precision = 0.5 * (form + form.transpose(1, 2))
    eig = torch.linalg.eigvalsh(precision)
    peaked = eig[:, 0] > 1e-9
    eye = torch.eye(2, dtype=precision.dtype).expand_as(precision)
    safe = torch.where(peaked[:, None, None], precision, eye)
    cov_v = torch.linalg.inv(safe)
    mean_v = (cov_v @ lin[:, :, None])[:, :, 0]          # (dx, dy)
    centre = torch.stack([-mean_v[:, 1], mean_v[:, 0]], -1)   # (oy, ox)
    flip = torch.tensor([[0.0, -1.0], [1.0, 0.0]], dtype=cov_v.dtype)
    # (oy, ox) = F (dx, dy) with F = [[0, -1], [1, 0]]
    cov = flip @ cov_v @ flip.T
    return centre, cov, peaked


def map_moments(maps: QueryMaps) -> Tuple[torch.Tensor, torch.Tensor]:
    """Centre and covariance (image orientation) of each group's |weights|."""
    oy, ox = maps.offsets()
    w = maps.weights.abs().nan_to_num(0.0)
    total = w.sum(dim=(1, 2)).clamp(min=1e-300)
    my = (w * oy).sum(dim=(1, 2)) / total
    mx = (w * ox).sum(dim=(1, 2)) / total
    dy, dx = oy - my[:, None, None], ox - mx[:, None, None]
    cyy = (w * dy * dy).sum(dim=(1, 2)) / total
    cxx = (w * dx * dx).sum(dim=(1, 2)) / total
    cxy = (w * dy * dx).sum(dim=(1, 2)) / total
    cov = torch.stack([torch.stack([cyy, cxy], -1),
                       torch.stack([cxy, cxx], -1)], -2)
    return torch.stack([my, mx], -1), cov


def group_summaries(gate: GateUnit, maps: Optional[QueryMaps] = None
                    ) -> List[GroupSummary]:
    """Per group: centre offset and spread of where it looks.

    GQPE: the Gaussian's own centre and covariance (they do not depend on
    the window or the query; a group whose quadratic is not peaked falls
    back to the map). LRPE and SGU: the weighted mean and covariance of
    |weights| of the query in ``maps`` (default: the window's centre query).
    The map moments are kept for every gate (``map_centre``).
    """
    maps = query_maps(gate) if maps is None else maps
    m_centre, m_cov = map_moments(maps)
    out = []
    if maps.kind == 'gqpe':
        centre, cov, peaked = gqpe_gaussians(gate.pos)
    for g in range(maps.groups):
        mc = tuple(m_centre[g].tolist())
        mv = tuple(tuple(r) for r in m_cov[g].tolist())
        if maps.kind == 'gqpe' and bool(peaked[g]):
            out.append(GroupSummary(g, tuple(centre[g].tolist()),
                                    tuple(tuple(r) for r in cov[g].tolist()),
                                    'gaussian', True, mc, mv))
        else:
            out.append(GroupSummary(g, mc, mv, 'map',
                                    maps.kind != 'gqpe', mc, mv))
    return out


# ----------------------------------------------------------------- resizing
def scale_query(query: Tuple[int, int], src: Tuple[int, int],
                dst: Tuple[int, int]) -> Tuple[int, int]:
    """The query at the same relative place in another window."""
    out = []
    for q, s, d in zip(query, src, dst):
        pos = math.floor((q + 0.5) * d / s)
        out.append(min(max(pos, 0), d - 1))
    return tuple(out)


def resized_gate(gate: GateUnit, window) -> GateUnit:
    """The same gate built for another window, holding the original weights.

    The weights are put in with ``load_state_dict``: the model's own load
    hook resizes what depends on the window (LRPE tables and the per-query
    bias, bicubic; GQPE's parameters need nothing), exactly as when a
    checkpoint is loaded into a model built with ``window_size=window``.
    SGU weights (and LRPE's optional N x N token matrix) are tied to their
    window and raise ValueError.
    """
    if isinstance(window, int):
        window = (window, window)
    window = tuple(int(v) for v in window)
    if len(window) != 2 or min(window) <= 0:
        raise ValueError(f'a window is a positive int or (wh, ww), got '
                         f'{window}')
    kind = gate_kind(gate)
    if kind == 'sgu':
        raise ValueError('SGU weights are a learned N x N matrix tied to the '
                         'window they were trained with; they cannot be '
                         'resized to another window')
    if not gate.pos_only:
        raise ValueError('this LRPE gate has a learned N x N token matrix '
                         '(pos_only=False), tied to its window; it cannot be '
                         'resized to another window')
    pos = gate.pos
    new = PoSGU(gate.channels, window, gate.groups, encoding=kind,
                pos_only=True,
                generalized=getattr(pos, 'generalized', True))
    if kind == 'gqpe':
        new.pos.symmetric = pos.symmetric
    ref = next(gate.parameters())
    new.to(device=ref.device, dtype=ref.dtype)
    new.load_state_dict(gate.state_dict())
    return new.eval()


def windows_with(model: PosMLP, level: int, window) -> tuple:
    """``window_size`` for PosMLP: the model's windows, one level replaced."""
    if isinstance(window, int):
        window = (window, window)
    return tuple(tuple(window) if i == level else tuple(s.window)
                 for i, s in enumerate(model.specs))


# ------------------------------------------------ effective receptive field
def conv_out(length: int, kernel: int = 3, stride: int = 2,
             padding: int = 1) -> int:
    return (length + 2 * padding - kernel) // stride + 1


def level_map_sizes(model: PosMLP, size: Tuple[int, int]
                    ) -> List[Tuple[int, int]]:
    """(h, w) of every level's map for an input image of ``size``."""
    return model.level_map_sizes(*size)


def level_strides(model: PosMLP) -> List[int]:
    return [4 * 2 ** i for i in range(len(model.levels))]


def level_output(model: PosMLP, x: torch.Tensor, level: int) -> torch.Tensor:
    """The raw (B, H, W, C) output of ``level``; later levels are not run."""
    return model.forward_intermediates(
        x, indices=[level], stop_early=True, output_fmt='NHWC',
        intermediates_only=True)[0]


def _expand_to_windows(lo: int, hi: int, spans) -> Tuple[int, int]:
    first = next(a for a, b in spans if a <= lo <= b)
    last = next(b for a, b in spans if a <= hi <= b)
    return first, last


def _conv_reach(lo: int, hi: int, length: int, kernel: int = 3,
                stride: int = 2, padding: int = 1) -> Tuple[int, int]:
    """Input indices that outputs lo..hi of a conv read (clipped)."""
    return (max(lo * stride - padding, 0),
            min(hi * stride - padding + kernel - 1, length - 1))


def theoretical_reach(model: PosMLP, level: int, point: Tuple[int, int],
                      size: Tuple[int, int]) -> Tuple[Tuple[int, int],
                                                      Tuple[int, int]]:
    """Pixels that the output token ``point`` of ``level`` can depend on.

    Walks back from the token: every block of a level widens the set to the
    windows that contain it (the level's own window grid, shifted grids
    included), the downsampling conv (3x3, stride 2, padding 1) of a level
    maps token i to tokens 2i-1..2i+1 below, and the stem (3x3/2, 3x3/2,
    1x1) maps a level-0 token j to pixels 4j-3..4j+3. Every step acts on
    rows and columns separately, and the windows form a grid, so the reach
    is a rectangle. Returns inclusive pixel bounds ((y0, y1), (x0, x1)).
    """
    sizes = level_map_sizes(model, size)
    if not 0 <= level < len(model.levels):
        raise IndexError(f'level {level} does not exist: the model has '
                         f'{len(model.levels)} levels')
    hl, wl = sizes[level]
    if not (0 <= point[0] < hl and 0 <= point[1] < wl):
        raise ValueError(f'token {tuple(point)} is outside the {hl}x{wl} map '
                         f'of level {level} for a {size[0]}x{size[1]} image')
    stem1 = (conv_out(size[0]), conv_out(size[1]))
    bounds = []
    for axis in (0, 1):
        lo = hi = int(point[axis])
        for lv in range(level, -1, -1):
            lvl = model.levels[lv]
            depth = len(lvl.encoder)
            if depth:
                grids = lvl.window_grids(*sizes[lv])
                for j in reversed(range(depth)):
                    spans = grids[j % len(grids)].spans(axis)
                    lo, hi = _expand_to_windows(lo, hi, spans)
            if lv > 0:
                lo, hi = _conv_reach(lo, hi, sizes[lv - 1][axis])
        # stem: conv1x1 (same index), conv3x3/2, conv3x3/2
        lo, hi = _conv_reach(lo, hi, stem1[axis])
        lo, hi = _conv_reach(lo, hi, size[axis])
        bounds.append((lo, hi))
    return bounds[0], bounds[1]


def window_grid(model: PosMLP, level: int, size: Tuple[int, int]
                ) -> Tuple[List[Tuple[int, int]], List[Tuple[int, int]]]:
    """Token spans of the windows of a level's first block: (rows, cols)."""
    grid = model.levels[level].window_grids(
        *level_map_sizes(model, size)[level])[0]
    return grid.spans(0), grid.spans(1)


def default_point(model: PosMLP, level: int, size: Tuple[int, int]
                  ) -> Tuple[int, int]:
    """The centre token of the full window nearest the middle of the map."""
    rows, cols = window_grid(model, level, size)
    wh, ww = model.levels[level].window
    point = []
    for spans, w in ((rows, wh), (cols, ww)):
        full = [s for s in spans if s[1] - s[0] + 1 == w] or spans
        middle = (spans[0][0] + spans[-1][1]) / 2
        first, last = min(full, key=lambda s: abs((s[0] + s[1]) / 2 - middle))
        point.append((first + last) // 2)
    return tuple(point)


def normalize_images(images: torch.Tensor) -> torch.Tensor:
    """(B, 3, H, W) images in [0, 1] -> ImageNet-normalized model input."""
    mean = images.new_tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    std = images.new_tensor(IMAGENET_STD).view(1, 3, 1, 1)
    return (images - mean) / std


def synthetic_images(count: int, size: Tuple[int, int], seed: int = 0
                     ) -> torch.Tensor:
    """(count, 3, H, W) smooth random colour images in [0, 1].

    Multi-scale noise plus a few soft discs: something with edges and
    texture at several scales when no real images are at hand.
    """
    gen = torch.Generator().manual_seed(seed)
    h, w = size
    img = torch.zeros(count, 3, h, w)
    for cells in (4, 8, 16, 32):
        noise = torch.rand(count, 3, cells, cells, generator=gen)
        img += torch.nn.functional.interpolate(
            noise, size=(h, w), mode='bicubic', align_corners=False) / cells
    ys = torch.arange(h, dtype=torch.float32)[:, None]
    xs = torch.arange(w, dtype=torch.float32)[None, :]
    for b in range(count):
        for _ in range(6):
            cy, cx = (torch.rand(2, generator=gen) * torch.tensor([h, w]))
            r = float(torch.rand(1, generator=gen)) * min(h, w) / 6 + 4
            colour = torch.rand(3, 1, 1, generator=gen)
            disc = torch.sigmoid(r - ((ys - cy) ** 2 + (xs - cx) ** 2).sqrt())
            img[b] = img[b] * (1 - disc) + colour * disc
    img -= img.amin(dim=(1, 2, 3), keepdim=True)
    img /= img.amax(dim=(1, 2, 3), keepdim=True).clamp(min=1e-6)
    return img


@dataclass
class ERF:
    """Mean |d output / d input| of one output token, over some images."""
    level: int
    point: Tuple[int, int]
    size: Tuple[int, int]
    stride: int
    grad: torch.Tensor                     # (H, W), summed over channels
    reach: Tuple[Tuple[int, int], Tuple[int, int]]
    window: Tuple[int, int]
    level_windows: Tuple[list, list]       # token spans of the level's windows
    level0_windows: Tuple[list, list]


def effective_receptive_field(model: PosMLP, images: torch.Tensor,
                              level: int = 1,
                              point: Optional[Tuple[int, int]] = None
                              ) -> ERF:
    """Gradient of the level's output at token ``point`` w.r.t. the input.

    ``images`` are model input (already normalized), (B, C, H, W). The
    channels of the output token are summed (every channel's gradient gets
    weight one, as in the usual ERF definition); the absolute input
    gradient is summed over input channels and averaged over images. The
    model is put in eval mode, so BatchNorm uses its running statistics and
    images do not interact.
    """
    if not 0 <= level < len(model.levels):
        raise IndexError(f'ERF level {level} does not exist: the model has '
                         f'{len(model.levels)} levels (0..'
                         f'{len(model.levels) - 1})')
    model.eval()
    size = tuple(images.shape[-2:])
    point = default_point(model, level, size) if point is None \
        else tuple(int(v) for v in point)
    reach = theoretical_reach(model, level, point, size)   # checks point
    x = images.detach().clone().requires_grad_(True)
    with torch.enable_grad():
        out = level_output(model, x, level)
        out[:, point[0], point[1], :].sum().backward()
    grad = x.grad.abs().sum(dim=1).mean(dim=0)
    return ERF(level=level, point=point, size=size,
               stride=level_strides(model)[level], grad=grad.detach(),
               reach=reach, window=tuple(model.levels[level].window),
               level_windows=window_grid(model, level, size),
               level0_windows=window_grid(model, 0, size))


def support_box(grad: torch.Tensor) -> Optional[Tuple[Tuple[int, int],
                                                      Tuple[int, int]]]:
    """Inclusive bounding box ((y0, y1), (x0, x1)) of the non-zero entries."""
    nz = torch.nonzero(grad)
    if nz.numel() == 0:
        return None
    return ((int(nz[:, 0].min()), int(nz[:, 0].max())),
            (int(nz[:, 1].min()), int(nz[:, 1].max())))


def named_gates(model: nn.Module):
    """(level, block, gate) of every block of a PosMLP."""
    for i, level in enumerate(model.levels):
        for j, block in enumerate(level.encoder):
            yield i, j, block.gate_unit


__all__ = [
    'LoadedBackbone', 'load_backbone', 'get_gate', 'gate_kind',
    'centre_query', 'full_rect', 'check_query', 'QueryMaps', 'query_maps',
    'GroupSummary', 'gqpe_gaussians', 'map_moments', 'group_summaries',
    'scale_query', 'resized_gate', 'windows_with', 'level_map_sizes',
    'level_strides', 'level_output', 'theoretical_reach', 'window_grid',
    'default_point', 'normalize_images', 'synthetic_images', 'ERF',
    'effective_receptive_field', 'support_box', 'named_gates']
