"""Draw what PosMLP's positional gating learned, from a checkpoint.

    python tools/visualize_posmap.py CHECKPOINT [--level L] [--block B]
        [--query y,x] [--window W] [--out DIR] [--erf ...]

Writes, under ``--out`` (PNG and SVG by default):

* ``posmap_L{L}_B{B}.*``: for one query token of the window, every group's
  mixing weights over the window as a grid of heat-maps (GQPE Gaussians,
  LRPE table entries, SGU matrix rows), taken from the gate's own mixing
  matrices; GQPE panels also show the Gaussian's centre and 1-sigma ellipse;
* ``posmap_L{L}_B{B}_resized_{h}x{w}.*``: the same maps side by side with
  those of the same weights loaded into a gate built for another window;
* ``summary_L{i}.*`` for every level, and ``summary.json``: each group's
  centre offset and spread, i.e. where and how far it looks;
* with ``--erf``: ``erf_L{E}.*``, the effective receptive field of one output
  token of level E (mean |gradient| w.r.t. the input image over a few
  images), drawn over an image with the theoretical reach and window grids.

The checkpoint may be a released ImageNet checkpoint, one converted by this
package (.pth or .safetensors) or an mmdet/mmseg training checkpoint (the
``backbone.`` prefix is found automatically). Offsets are in tokens of the
level, x to the right and y downwards.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

try:
    import posmlp_dense  # noqa: F401
except ImportError:  # run from a checkout without installing
    sys.path.insert(0, os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))

from posmlp_dense.analysis import posmap as pm  # noqa: E402
from posmlp_dense.checkpoint import CheckpointError  # noqa: E402

MAX_COLS = 8


# ---------------------------------------------------------------- plotting
def _mpl():
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    return matplotlib, plt


def _extent(maps: pm.QueryMaps):
    """imshow extent putting cell centres at key offsets (x right, y down)."""
    wh, ww = maps.window
    qy, qx = maps.query
    return (-qx - 0.5, ww - qx - 0.5, wh - qy - 0.5, -qy - 0.5)


def _norm_for(maps_list: Sequence[pm.QueryMaps]):
    matplotlib, _ = _mpl()
    values = np.concatenate([m.weights.numpy().ravel() for m in maps_list])
    values = values[np.isfinite(values)]
    hi = float(np.abs(values).max()) if values.size else 1.0
    hi = hi if hi > 0 else 1.0
    if maps_list[0].kind == 'gqpe' and values.min() >= 0:
        return matplotlib.colors.Normalize(0.0, hi), 'viridis', \
            'mixing weight (softmax)'
    label = 'mixing weight' if maps_list[0].kind == 'lrpe' else \
        'SGU matrix entry'
    return matplotlib.colors.Normalize(-hi, hi), 'RdBu_r', label


def _cmap(name):
    matplotlib, _ = _mpl()
    return matplotlib.colormaps[name].with_extremes(bad='#d9d9d9')


def _ellipse(ax, centre, cov, nsig=1.0, **kw):
    """Draw an nsig ellipse of a (oy, ox) covariance on x-right/y-down axes."""
    from matplotlib.patches import Ellipse
    cov = np.asarray(cov, dtype=float)
    # axes coordinates are (x, y) = (ox, oy)
    cxy = np.array([[cov[1, 1], cov[0, 1]], [cov[1, 0], cov[0, 0]]])
    vals, vecs = np.linalg.eigh(cxy)
    vals = np.clip(vals, 0, None)
    angle = math.degrees(math.atan2(vecs[1, 1], vecs[0, 1]))
    patch = Ellipse((centre[1], centre[0]), 2 * nsig * math.sqrt(vals[1]),
                    2 * nsig * math.sqrt(vals[0]), angle=angle, fill=False,
                    **kw)
    ax.add_patch(patch)
    return patch


def _draw_group(ax, maps: pm.QueryMaps, g: int, norm, cmap,
                summary: Optional[pm.GroupSummary], limits=None,
                small: bool = False):
    data = np.ma.masked_invalid(maps.weights[g].numpy())
    img = ax.imshow(data, extent=_extent(maps), origin='upper', norm=norm,
                    cmap=cmap, interpolation='nearest')
    img.set_gid(f'group{g}')
    from matplotlib.patches import Rectangle
    # the query's cell: an outline that leaves its colour visible
    ax.add_patch(Rectangle((-0.5, -0.5), 1, 1, fill=False, ec='white',
                           lw=1.6 if not small else 1.1))
    ax.add_patch(Rectangle((-0.5, -0.5), 1, 1, fill=False, ec='black',
                           lw=0.6 if not small else 0.4))
    wh, ww = maps.window
    qy, qx = maps.query
    ax.add_patch(Rectangle((-qx - 0.5, -qy - 0.5), ww, wh, fill=False,
                           lw=0.8, ec='black'))
    title = f'group {g}'
    if summary is not None:
        cy, cx = summary.centre
        if summary.source == 'gaussian' and not small:
            _ellipse(ax, summary.centre, summary.cov, 1.0, ec='white',
                     lw=0.7, ls='--')
            ax.plot([cx], [cy], marker='x', color='red', markersize=4,
                    mew=1.0)
        major, _ = summary.std_axes
        title += f'\nc=({cy:+.1f},{cx:+.1f}) s={major:.1f}'
    ax.set_title(title, fontsize=7 if small else 8)
    if limits is not None:
        ax.set_xlim(limits[0])
        ax.set_ylim(limits[1])
    ax.tick_params(labelsize=6)
    if limits is None:
        span = max(wh, ww)
    else:
        span = max(abs(limits[0][1] - limits[0][0]),
                   abs(limits[1][1] - limits[1][0]))
    step = max(1, int(math.ceil(span / 7)))
    ax.xaxis.set_major_locator(_int_locator(step))
    ax.yaxis.set_major_locator(_int_locator(step))
    return img


def _int_locator(step):
    from matplotlib.ticker import MultipleLocator
    return MultipleLocator(step)


def _group_list(spec: Optional[str], groups: int) -> List[int]:
    if spec is None:
        return list(range(groups))
    out = []
    for part in spec.split(','):
        part = part.strip()
        if not part:
            continue
        try:
            if '-' in part:
                a, b = part.split('-')
                out.extend(range(int(a), int(b) + 1))
            else:
                out.append(int(part))
        except ValueError:
            raise ValueError(f'--groups: cannot read {spec!r}; use e.g. '
                             f'"0-7" or "0,3,5"') from None
    bad = [g for g in out if not 0 <= g < groups]
    if bad:
        raise ValueError(f'--groups: group(s) {bad} do not exist; this gate '
                         f'has {groups} groups (0..{groups - 1})')
    return out


def render_query_maps(maps: pm.QueryMaps, title: str,
                      summaries: Optional[List[pm.GroupSummary]] = None,
                      groups: Optional[List[int]] = None):
    """Grid of heat-maps, one per group; returns the figure.

    Every panel's image holds exactly ``maps.weights[g]`` (NaN where a
    partial window has no key); its ``gid`` is ``group{g}``.
    """
    _, plt = _mpl()
    groups = list(range(maps.groups)) if groups is None else groups
    cols = min(len(groups), MAX_COLS)
    rows = int(math.ceil(len(groups) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(1.75 * cols + 1.2,
                                                  1.9 * rows + 1.0),
                             squeeze=False, constrained_layout=True)
    norm, cmap_name, label = _norm_for([maps])
    cmap = _cmap(cmap_name)
    img = None
    for k, ax in enumerate(axes.ravel()):
        if k >= len(groups):
            ax.axis('off')
            continue
        g = groups[k]
        img = _draw_group(ax, maps, g, norm, cmap,
                          summaries[g] if summaries else None)
        if k % cols == 0:
            ax.set_ylabel('Δy (tokens, down)', fontsize=7)
        if k // cols == rows - 1 or k + cols >= len(groups):
            ax.set_xlabel('Δx (tokens, right)', fontsize=7)
    fig.colorbar(img, ax=axes, shrink=0.8, label=label)
    fig.suptitle(title, fontsize=10)
    return fig


def render_comparison(before: pm.QueryMaps, after: Optional[pm.QueryMaps],
                      title: str, groups: List[int],
                      before_summ=None, after_summ=None,
                      note: Optional[str] = None):
    """The same groups before (left) and after (right) a window resize."""
    _, plt = _mpl()
    cols = min(len(groups), 4)
    rows = int(math.ceil(len(groups) / cols))
    fig = plt.figure(figsize=(2 * 1.75 * cols + 1.6, 1.9 * rows + 1.2),
                     constrained_layout=True)
    left, right = fig.subfigures(1, 2, wspace=0.04)
    both = [m for m in (before, after) if m is not None]
    norm, cmap_name, label = _norm_for(both)
    cmap = _cmap(cmap_name)
    # common limits (in token offsets) so both sides share a scale
    xs, ys = [], []
    for m in both:
        ext = _extent(m)
        xs += [ext[0], ext[1]]
        ys += [ext[2], ext[3]]
    limits = ((min(xs), max(xs)), (max(ys), min(ys)))
    img, bar_owner = None, None
    for sub, maps, summ, name in ((left, before, before_summ, 'trained'),
                                  (right, after, after_summ, 'resized')):
        if maps is None:
            ax = sub.subplots()
            ax.axis('off')
            ax.text(0.5, 0.5, note or 'cannot be resized', ha='center',
                    va='center', wrap=True, fontsize=10)
            sub.suptitle(name, fontsize=9)
            continue
        axes = sub.subplots(rows, cols, squeeze=False)
        for k, ax in enumerate(axes.ravel()):
            if k >= len(groups):
                ax.axis('off')
                continue
            g = groups[k]
            img = _draw_group(ax, maps, g, norm, cmap,
                              summ[g] if summ else None, limits=limits,
                              small=True)
            if k % cols == 0:
                ax.set_ylabel('Δy (tokens)', fontsize=7)
            if k + cols >= len(groups):
                ax.set_xlabel('Δx (tokens)', fontsize=7)
        bar_owner = (sub, axes)
        wh, ww = maps.window
        sub.suptitle(f'{name}: window {wh}x{ww}, query (y={maps.query[0]}, '
                     f'x={maps.query[1]})', fontsize=9)
    if bar_owner is not None:
        sub, axes = bar_owner
        sub.colorbar(img, ax=axes, shrink=0.8, label=label)
    fig.suptitle(title, fontsize=10)
    return fig


def render_summary(level: int, entries: List[dict]):
    """One panel per block: each group's centre and 1-sigma spread."""
    _, plt = _mpl()
    from matplotlib.patches import Rectangle
    n = len(entries)
    cols = min(n, 4)
    rows = int(math.ceil(n / cols))
    fig, axes = plt.subplots(rows, cols,
                             figsize=(3.6 * cols, 3.6 * rows + 0.4),
                             squeeze=False, constrained_layout=True)
    cmap = plt.get_cmap('tab20')
    for k, ax in enumerate(axes.ravel()):
        if k >= n:
            ax.axis('off')
            continue
        e = entries[k]
        maps: pm.QueryMaps = e['maps']
        wh, ww = maps.window
        qy, qx = maps.query
        ax.add_patch(Rectangle((-qx - 0.5, -qy - 0.5), ww, wh, fill=False,
                               lw=1.0, ec='0.4', ls='-'))
        reach = max(wh, ww)
        pts = [(0.0, 0.0)]
        for s in e['summaries']:
            colour = cmap(s.group % 20)
            cy, cx = s.centre
            _ellipse(ax, s.centre, s.cov, 1.0, ec=colour, lw=1.2)
            marker = 'o' if s.source == 'gaussian' else 's'
            ax.plot([cx], [cy], marker=marker, color=colour, markersize=4)
            if len(e['summaries']) <= 32:
                ax.annotate(str(s.group), (cx, cy), fontsize=6,
                            xytext=(3, 2), textcoords='offset points')
            pts.append((cy, cx))
        pts = np.array(pts)
        span = max(reach / 2 + 1, float(np.abs(pts).max()) + 1.5)
        span = min(span, 2 * reach)
        ax.set_xlim(-span, span)
        ax.set_ylim(span, -span)
        ax.set_aspect('equal')
        ax.axhline(0, color='0.8', lw=0.6, zorder=0)
        ax.axvline(0, color='0.8', lw=0.6, zorder=0)
        ax.plot([0], [0], marker='+', color='black', markersize=10)
        ax.set_xlabel('Δx (tokens, right)', fontsize=8)
        ax.set_ylabel('Δy (tokens, down)', fontsize=8)
        what = ('Gaussian centres, 1σ ellipses' if e['kind'] == 'gqpe' else
                '|weight| centre of mass, 1σ')
        ax.set_title(f'block {e["block"]} ({e["kind"]}, {wh}x{ww}): {what}',
                     fontsize=8)
        ax.tick_params(labelsize=7)
    fig.suptitle(f'level {level}: where each group looks (query at the window '
                 f'centre, box = window)', fontsize=10)
    return fig


def render_erf(erf: pm.ERF, image: Optional[np.ndarray], title: str):
    """Image with the ERF overlaid, a log-scale zoom, and a row profile."""
    _, plt = _mpl()
    from matplotlib.colors import LogNorm
    from matplotlib.patches import Rectangle
    grad = erf.grad.double().numpy()
    peak = grad.max() if grad.max() > 0 else 1.0
    rel = grad / peak
    floor = 1e-4
    shown = np.ma.masked_less(rel, floor)
    (y0, y1), (x0, x1) = erf.reach
    s = erf.stride
    py, px = erf.point
    H, W = erf.size
    fig, axes = plt.subplots(1, 3, figsize=(15, 5.0),
                             gridspec_kw=dict(width_ratios=[1.25, 1, 1.1]),
                             constrained_layout=True)

    def overlay(ax, zoom):
        if image is not None and not zoom:
            # the image in grey, so that the heat-map's colours stand out
            ax.imshow(image.mean(axis=2), cmap='gray', vmin=0, vmax=1,
                      extent=(-0.5, W - 0.5, H - 0.5, -0.5), alpha=0.6)
        im = ax.imshow(shown, cmap='inferno', norm=LogNorm(floor, 1.0),
                       extent=(-0.5, W - 0.5, H - 0.5, -0.5),
                       alpha=0.75 if not zoom else 1.0,
                       interpolation='nearest')
        ax.add_patch(Rectangle((x0 - 0.5, y0 - 0.5), x1 - x0 + 1,
                               y1 - y0 + 1, fill=False, ec='cyan', lw=1.4,
                               ls='--', label='theoretical reach'))
        line = '0.45' if zoom else 'white'
        for spans, vertical in ((erf.level_windows[1], True),
                                (erf.level_windows[0], False)):
            for a, _ in spans[1:]:
                pos = a * s - 0.5
                (ax.axvline if vertical else ax.axhline)(
                    pos, color=line, lw=0.9, alpha=0.9)
        for spans, vertical in ((erf.level0_windows[1], True),
                                (erf.level0_windows[0], False)):
            for a, _ in spans[1:]:
                pos = a * 4 - 0.5
                (ax.axvline if vertical else ax.axhline)(
                    pos, color=line, lw=0.7, ls=':', alpha=0.8)
        ax.add_patch(Rectangle((px * s - 0.5, py * s - 0.5), s, s,
                               fill=False, ec='lime', lw=1.5,
                               label=f'output token {erf.point}'))
        ax.set_xlabel('x (pixels)')
        ax.set_ylabel('y (pixels)')
        return im

    overlay(axes[0], False)
    axes[0].set_title(f'ERF over the image ({H}x{W})', fontsize=9)
    axes[0].legend(loc='lower left', fontsize=7, framealpha=0.8)
    im = overlay(axes[1], True)
    margin = max(16, 2 * s)
    axes[1].set_xlim(max(x0 - margin, -0.5), min(x1 + margin, W - 0.5))
    axes[1].set_ylim(min(y1 + margin, H - 0.5), max(y0 - margin, -0.5))
    axes[1].set_title('zoom: solid = level-%d windows, dotted = level-0 '
                      'windows' % erf.level, fontsize=9)
    fig.colorbar(im, ax=axes[1], shrink=0.8,
                 label='|d out / d pixel| / max (log; < 1e-4 blank)')
    row = grad[min(max(py * s + s // 2, 0), H - 1)]
    col = grad[:, min(max(px * s + s // 2, 0), W - 1)]
    tiny = 1e-12
    axes[2].semilogy(np.arange(W), np.maximum(row / peak, tiny), lw=1.0,
                     label='along x (row through the token)')
    axes[2].semilogy(np.arange(H), np.maximum(col / peak, tiny), lw=1.0,
                     alpha=0.8, label='along y (column through the token)')
    for v in (x0, x1):
        axes[2].axvline(v, color='c', ls='--', lw=1)
    for a, _ in erf.level_windows[1][1:]:
        axes[2].axvline(a * s - 0.5, color='0.6', lw=0.6)
    axes[2].set_ylim(tiny / 3, 2)
    axes[2].set_xlabel('pixel')
    axes[2].set_ylabel('relative |gradient| (exact zeros drawn at 1e-12)')
    axes[2].set_title(f'profiles (dashed: reach; grey: level-{erf.level} '
                      f'window borders)', fontsize=9)
    axes[2].legend(fontsize=7, loc='upper right')
    fig.suptitle(title, fontsize=10)
    return fig


def save_figure(fig, out_dir: str, name: str, formats: Sequence[str],
                dpi: int) -> List[str]:
    paths = []
    for fmt in formats:
        path = os.path.join(out_dir, f'{name}.{fmt}')
        fig.savefig(path, dpi=dpi)
        paths.append(path)
    return paths


# --------------------------------------------------------------- arguments
def _pair(text: str, name: str) -> Tuple[int, int]:
    try:
        parts = [int(v) for v in text.replace('x', ',').split(',')]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f'{name}: expected two integers "a,b", got {text!r}') from None
    if len(parts) == 1:
        parts = parts * 2
    if len(parts) != 2:
        raise argparse.ArgumentTypeError(
            f'{name}: expected two integers "a,b", got {text!r}')
    return parts[0], parts[1]


def _rect(text: str) -> Tuple[int, int, int, int]:
    try:
        parts = tuple(int(v) for v in text.split(','))
    except ValueError:
        parts = ()
    if len(parts) != 4:
        raise argparse.ArgumentTypeError(
            f'--rect: expected r0,r1,c0,c1, got {text!r}')
    return parts


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description='Pictures of what the positional gating of a PosMLP '
                    'checkpoint learned.',
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument('checkpoint', help='released, converted (.pth/'
                   '.safetensors) or mmdet/mmseg training checkpoint')
    p.add_argument('--level', type=int, default=0, help='level of the block')
    p.add_argument('--block', type=int, default=0,
                   help='block within the level')
    p.add_argument('--query', type=lambda t: _pair(t, '--query'),
                   default=None, metavar='Y,X',
                   help='query token inside the window (default: centre)')
    p.add_argument('--rect', type=_rect, default=None,
                   metavar='R0,R1,C0,C1',
                   help='draw a partial window: its real tokens are rows '
                        'R0:R1, cols C0:C1 of the window (as at map borders)')
    p.add_argument('--window', default=None, metavar='W',
                   help='window to resize to for the side-by-side view: W '
                        'or WH,WW (default: twice the level\'s window); '
                        '"none" skips it')
    p.add_argument('--groups', default=None,
                   help='groups to draw, e.g. "0-7" or "0,3" (default all; '
                        'the resized view draws at most 8)')
    p.add_argument('--out', default='work_dirs/posmap',
                   help='output folder')
    p.add_argument('--formats', default='png,svg',
                   help='comma-separated figure formats')
    p.add_argument('--dpi', type=int, default=110)
    p.add_argument('--which', choices=('ema', 'raw'), default='ema',
                   help='EMA or raw weights of a released checkpoint')
    p.add_argument('--prefix', default=None,
                   help='model prefix in the checkpoint (default: found '
                        'automatically, e.g. "backbone.")')
    p.add_argument('--shift', action='store_true',
                   help='the checkpoint was trained with shifted windows')
    p.add_argument('--summary', choices=('all', 'level', 'none'),
                   default='all',
                   help='summary figures for every level, only --level, or '
                        'none (summary.json always covers every level)')
    p.add_argument('--no-posmap', action='store_true',
                   help='skip the per-block maps and summaries')
    erf = p.add_argument_group('effective receptive field')
    erf.add_argument('--erf', action='store_true',
                     help='also draw the effective receptive field')
    erf.add_argument('--erf-level', type=int, default=None,
                     help='level whose output token is traced (default 1); '
                          'this and the other --erf-* options imply --erf')
    erf.add_argument('--erf-images', default=None,
                     help='a folder of images, or a number N of synthetic '
                          'images (default 4)')
    erf.add_argument('--erf-size', type=int, nargs=2, default=None,
                     metavar=('H', 'W'),
                     help='input size (default 512 512)')
    erf.add_argument('--erf-point', type=lambda t: _pair(t, '--erf-point'),
                     default=None, metavar='Y,X',
                     help='output token of that level (default: centre of '
                          'the window nearest the middle of the map)')
    erf.add_argument('--seed', type=int, default=0)
    return p


# -------------------------------------------------------------------- work
IMAGE_SUFFIXES = ('.png', '.jpg', '.jpeg', '.bmp', '.webp', '.tif', '.tiff')


def load_images(spec: Optional[str], size: Tuple[int, int], seed: int
                ) -> Tuple[torch.Tensor, str]:
    """(N, 3, H, W) images in [0, 1] and a description of where from."""
    if spec is None:
        spec = '4'
    if spec.isdigit():
        n = int(spec)
        if n <= 0:
            raise ValueError('--erf-images: the number of images must be > 0')
        return pm.synthetic_images(n, size, seed), f'{n} synthetic images'
    if not os.path.isdir(spec):
        raise FileNotFoundError(f'--erf-images: {spec!r} is neither a number '
                                f'nor an existing folder')
    names = sorted(f for f in os.listdir(spec)
                   if f.lower().endswith(IMAGE_SUFFIXES))
    if not names:
        raise FileNotFoundError(f'--erf-images: no images '
                                f'({", ".join(IMAGE_SUFFIXES)}) in {spec!r}')
    from PIL import Image
    images = []
    for name in names[:16]:
        with Image.open(os.path.join(spec, name)) as im:
            im = im.convert('RGB').resize((size[1], size[0]),
                                          Image.BILINEAR)
            arr = np.asarray(im, dtype=np.float32) / 255.0
        images.append(torch.from_numpy(arr).permute(2, 0, 1))
    return torch.stack(images), f'{len(images)} images from {spec}'


def posmap_figures(model, level: int, block: int, query, rect, window_spec,
                   group_spec) -> Dict[str, object]:
    """Figures (and data) for one block; see ``run``."""
    gate = pm.get_gate(model, level, block)
    kind = pm.gate_kind(gate)
    maps = pm.query_maps(gate, query, rect)
    summ = pm.group_summaries(gate, pm.query_maps(gate)) \
        if kind == 'gqpe' else pm.group_summaries(gate, maps)
    groups = _group_list(group_spec, maps.groups)
    wh, ww = maps.window
    extra = '' if maps.rect == pm.full_rect(maps.window) else \
        f', partial window rows {maps.rect[0]}:{maps.rect[1]} cols ' \
        f'{maps.rect[2]}:{maps.rect[3]}'
    title = (f'level {level} block {block}: {kind.upper()} mixing weights of '
             f'query (y={maps.query[0]}, x={maps.query[1]}) in the {wh}x{ww} '
             f'window{extra}; bias {maps.bias:+.3f}'
             + ('\nwhite box = query, x = Gaussian centre, dashed = 1σ '
                'ellipse; c = centre (Δy, Δx), s = largest std (tokens)'
                if kind == 'gqpe' else '\nwhite box = query; grey = no key '
                '(outside the real tokens)'))
    out = dict(maps=maps, summaries=summ, gate=gate, kind=kind)
    out['fig_posmap'] = render_query_maps(
        maps, title, summ if kind == 'gqpe' else None, groups)
    if window_spec is not None and str(window_spec).lower() == 'none':
        return out
    if window_spec is None:
        dst = (min(2 * wh, 64), min(2 * ww, 64))
    else:
        dst = _pair(str(window_spec), '--window')
        if min(dst) <= 0 or max(dst) > 64:
            raise ValueError(f'--window {window_spec}: window sides must be '
                             f'in 1..64')
    show = groups[:8]
    try:
        new_gate = pm.resized_gate(gate, dst)
    except ValueError as err:
        new_gate, note = None, str(err)
    else:
        note = None
    # the resized view compares full windows, whatever --rect says
    before_maps = maps if maps.rect == pm.full_rect(maps.window) else \
        pm.query_maps(gate, maps.query)
    new_maps = new_summ = None
    if new_gate is not None:
        new_maps = pm.query_maps(
            new_gate, pm.scale_query(maps.query, maps.window, dst))
        if kind == 'gqpe':
            new_summ = pm.group_summaries(new_gate, pm.query_maps(new_gate))
        out.update(resized_gate=new_gate, resized_maps=new_maps)
    how = {'gqpe': 'GQPE: same parameters, Gaussian evaluated on the new '
                   'offsets',
           'lrpe': 'LRPE: relative table and per-query bias resized '
                   '(bicubic) by the load hook',
           'sgu': 'SGU: weights tied to the window'}[kind]
    out['fig_resized'] = render_comparison(
        before_maps, new_maps,
        f'level {level} block {block}: window {wh}x{ww} -> {dst[0]}x{dst[1]} '
        f'({how})', show,
        summ if kind == 'gqpe' else None, new_summ, note)
    out['resized_window'] = dst
    return out


def summary_entries(model) -> Dict[int, List[dict]]:
    """Per level, per block: the centre-query maps and group summaries."""
    levels: Dict[int, List[dict]] = {}
    for i, j, gate in pm.named_gates(model):
        maps = pm.query_maps(gate)
        levels.setdefault(i, []).append(dict(
            block=j, kind=pm.gate_kind(gate), maps=maps,
            summaries=pm.group_summaries(gate, maps)))
    return levels


def run(args) -> Dict[str, object]:
    """Do everything ``args`` asks; returns figures, data and file paths."""
    _mpl()
    formats = [f.strip().lower() for f in args.formats.split(',') if f.strip()]
    for fmt in formats:
        if fmt not in ('png', 'svg', 'pdf'):
            raise ValueError(f'--formats: unsupported format {fmt!r} '
                             f'(png, svg, pdf)')
    loaded = pm.load_backbone(args.checkpoint, which=args.which,
                              prefix=args.prefix, shift=args.shift)
    model = loaded.model
    result: Dict[str, object] = dict(loaded=loaded, files=[])
    os.makedirs(args.out, exist_ok=True)
    if not args.no_posmap:
        info = posmap_figures(model, args.level, args.block, args.query,
                              args.rect, args.window, args.groups)
        result.update(info)
        tag = f'L{args.level}_B{args.block}'
        result['files'] += save_figure(info['fig_posmap'], args.out,
                                       f'posmap_{tag}', formats, args.dpi)
        if 'fig_resized' in info:
            h, w = info['resized_window']
            result['files'] += save_figure(
                info['fig_resized'], args.out,
                f'posmap_{tag}_resized_{h}x{w}', formats, args.dpi)
        summary_json = dict(checkpoint=os.path.basename(args.checkpoint),
                            prefix=loaded.prefix, entry=loaded.entry,
                            config=_jsonable(loaded.config), levels={})
        result['fig_summary'] = {}
        for level, entries in summary_entries(model).items():
            if args.summary == 'all' or (args.summary == 'level'
                                         and level == args.level):
                fig = render_summary(level, entries)
                result['fig_summary'][level] = fig
                result['files'] += save_figure(
                    fig, args.out, f'summary_L{level}', formats, args.dpi)
            summary_json['levels'][str(level)] = [
                dict(block=e['block'], kind=e['kind'],
                     window=list(e['maps'].window),
                     query=list(e['maps'].query),
                     groups=[s.as_dict() for s in e['summaries']])
                for e in entries]
        path = os.path.join(args.out, 'summary.json')
        with open(path, 'w') as f:
            json.dump(summary_json, f, indent=1)
        result['files'].append(path)
        result['summary'] = summary_json
    wants_erf = args.erf or any(v is not None for v in (
        args.erf_level, args.erf_images, args.erf_size, args.erf_point))
    if args.no_posmap and not wants_erf:
        raise ValueError('nothing to draw: --no-posmap without --erf')
    if wants_erf:
        level = 1 if args.erf_level is None else args.erf_level
        if not 0 <= level < len(model.levels):
            raise IndexError(f'--erf-level {level} does not exist: the model '
                             f'has {len(model.levels)} levels (0..'
                             f'{len(model.levels) - 1})')
        size = tuple(args.erf_size) if args.erf_size else (512, 512)
        if min(size) < 8:
            raise ValueError(f'--erf-size {size}: too small')
        images, where = load_images(args.erf_images, size, args.seed)
        erf = pm.effective_receptive_field(
            model, pm.normalize_images(images), level, args.erf_point)
        (y0, y1), (x0, x1) = erf.reach
        box = pm.support_box(erf.grad)
        title = (f'effective receptive field of level-{level} token '
                 f'{erf.point} (stride {erf.stride}, windows '
                 f'{erf.window[0]}x{erf.window[1]}), mean over {where}; '
                 f'reach y {y0}..{y1}, x {x0}..{x1}; non-zero '
                 f'{"none" if box is None else box}')
        image = images[0].permute(1, 2, 0).numpy()
        fig = render_erf(erf, image, title)
        result['erf'] = erf
        result['fig_erf'] = fig
        result['files'] += save_figure(fig, args.out, f'erf_L{level}',
                                       formats, args.dpi)
    return result


def _jsonable(obj):
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    return obj


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        result = run(args)
    except (IndexError, ValueError, FileNotFoundError, CheckpointError,
            KeyError, argparse.ArgumentTypeError) as err:
        message = err.args[0] if isinstance(err, KeyError) and err.args \
            else str(err)
        print(f'visualize_posmap: error: {message}', file=sys.stderr)
        return 2
    finally:
        _close_all()
    for path in result['files']:
        print(path)
    return 0


def _close_all():
    if 'matplotlib.pyplot' in sys.modules:
        sys.modules['matplotlib.pyplot'].close('all')


if __name__ == '__main__':
    sys.exit(main())
