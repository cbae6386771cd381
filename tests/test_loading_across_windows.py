"""Weights made for one window size, loaded into a model with another.

The window-dependent tensors (LRPE relative tables, per-position biases) are
resized while loading. These tests check the loaded *values* against
expectations that do not use the package's resize code:

* the documented convention (posmlp_dense/relative_position.py): bicubic,
  ``align_corners=False``, on the (2wh-1) x (2ww-1) grid of offsets with the
  vertical offset along the rows (tables), on the wh x ww grid of query
  positions (biases); computed here by hand as separable 1-D resampling
  matrices;
* properties that hold for any sensible resize: a ramp along one offset axis
  stays along that axis and keeps its direction, a constant stays constant,
  the zero-offset entry lands on the zero-offset entry.

Every real loading path is covered: a plain ``load_state_dict``,
``load_pretrained`` from a file, and an mmdet ``init_cfg`` Pretrained.
"""
from __future__ import annotations

import math

import pytest
import torch

from posmlp_dense import PosMLP, load_pretrained
from posmlp_dense.checkpoint import read_checkpoint

from conftest import fixture_arch, fixture_path, load_tool, randomize_
from reference import lrpe_weights, per_window_forward_levels

ARCH = dict(embed_dims=(8, 16, 32, 64), depths=(1, 1, 1, 1),
            mlp_ratio=(4, 4, 4, 2), gamma=(4, 8, 16, 32),
            window_size=(7, 7, 7, 7))
TABLE = 'window_relative_position_bias_table'
BIAS = 'token_proj_n_bias'
PATHS = ('load_state_dict', 'load_pretrained', 'init_cfg')
WINDOW_PAIRS = [((7, 7), (14, 14)), ((14, 14), (7, 7)), ((7, 7), (5, 5))]


pytestmark = pytest.mark.usefixtures('one_thread')


# ------------------------------------------- the convention, done by hand
def _keys_cubic(t: float, a: float = -0.75):
    """Weights of the 4 neighbours at offsets -1, 0, 1, 2 for a sample at
    fraction ``t`` past neighbour 0 (Keys' cubic convolution; a = -0.75 as in
    PyTorch's and OpenCV's bicubic)."""
    def near(x):  # |x| <= 1
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x):  # 1 < |x| < 2
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return far(1 + t), near(t), near(1 - t), far(2 - t)


def bicubic_matrix(src: int, dst: int) -> torch.Tensor:
    """(dst, src) matrix of 1-D bicubic resampling, align_corners=False:
    output cell i samples the input at (i + 0.5) * src / dst - 0.5; samples
    beyond the border repeat the border cell."""
    matrix = torch.zeros(dst, src, dtype=torch.float64)
    for i in range(dst):
        x = (i + 0.5) * src / dst - 0.5
        x0 = math.floor(x)
        for k, w in zip(range(-1, 3), _keys_cubic(x - x0)):
            matrix[i, min(max(x0 + k, 0), src - 1)] += w
    return matrix


def resize_by_hand(grid: torch.Tensor, dst) -> torch.Tensor:
    """(h, w, channels) grid -> (dst_h, dst_w, channels), float64."""
    rows = bicubic_matrix(grid.shape[0], dst[0])
    cols = bicubic_matrix(grid.shape[1], dst[1])
    return torch.einsum('ih,hwc,jw->ijc', rows, grid.double(), cols)


def expected_table(table: torch.Tensor, src, dst) -> torch.Tensor:
    """LRPE table ((2sh-1)(2sw-1), groups) -> ((2dh-1)(2dw-1), groups):
    row (dy + wh - 1) * (2ww - 1) + (dx + ww - 1) of the table holds offset
    (dy, dx), so the table is a (2wh-1, 2ww-1) grid, dy along the rows."""
    grid = table.reshape(2 * src[0] - 1, 2 * src[1] - 1, -1)
    out = resize_by_hand(grid, (2 * dst[0] - 1, 2 * dst[1] - 1))
    return out.reshape(-1, table.shape[1])


def expected_bias(bias: torch.Tensor, src, dst) -> torch.Tensor:
    """Per-query bias (1, sh*sw, 1), query m = y * sw + x -> (1, dh*dw, 1)."""
    out = resize_by_hand(bias.reshape(src[0], src[1], 1), dst)
    return out.reshape(1, -1, 1)


def test_hand_bicubic_is_the_documented_convention():
    """Sanity of the helpers themselves: rows sum to one, an odd grid keeps
    its centre cell on the centre, mirrored grids resize mirrored, and the
    result is what torch's bicubic (align_corners=False) computes."""
    for src, dst in ((13, 27), (27, 13), (13, 9), (7, 9)):
        m = bicubic_matrix(src, dst)
        assert torch.allclose(m.sum(1), torch.ones(dst, dtype=torch.float64))
        assert torch.allclose(m, m.flip(0).flip(1))
        if src % 2 and dst % 2:
            centre = torch.zeros(src, dtype=torch.float64)
            centre[src // 2] = 1
            assert torch.allclose(m[dst // 2], centre)
    grid = torch.randn(13, 13, 3, dtype=torch.float64)
    by_torch = torch.nn.functional.interpolate(
        grid.permute(2, 0, 1)[None], size=(27, 9), mode='bicubic',
        align_corners=False)[0].permute(1, 2, 0)
    assert torch.allclose(resize_by_hand(grid, (27, 9)), by_torch)


# ------------------------------------------------------------- load paths
def _backbone(gate, window, **kwargs):
    return PosMLP(ARCH, gate=gate, window_size=window, out_norm=False,
                  **kwargs)


def load_across(path, state, gate, window, tmp_path, **kwargs):
    """A model with ``window`` that got ``state`` through ``path``."""
    if path == 'init_cfg':
        pytest.importorskip('mmdet')
    if path == 'load_state_dict':
        model = _backbone(gate, window, **kwargs)
        model.load_state_dict(state)
        return model
    file = str(tmp_path / 'weights.pth')
    torch.save({'state_dict': state}, file)
    if path == 'load_pretrained':
        model = _backbone(gate, window, **kwargs)
        load_pretrained(model, file)
        return model
    from mmdet.registry import MODELS
    model = MODELS.build(dict(
        type='PosMLP', arch=ARCH, gate=gate, window_size=window,
        out_norm=False, init_cfg=dict(type='Pretrained', checkpoint=file),
        **kwargs))
    model.init_weights()
    return model


def _positional(state, suffix):
    return {k: v for k, v in state.items() if k.endswith(suffix)}


@pytest.mark.parametrize('path', PATHS)
@pytest.mark.parametrize('src,dst', WINDOW_PAIRS + [((7, 7), (5, 9))])
def test_lrpe_tables_and_biases_follow_the_documented_resize(
        path, src, dst, tmp_path):
    source = randomize_(_backbone('lrpe', src), seed=1).state_dict()
    loaded = load_across(path, source, 'lrpe', dst, tmp_path).state_dict()
    tables = _positional(source, TABLE)
    biases = _positional(source, BIAS)
    assert len(tables) == len(biases) == sum(ARCH['depths'])
    for key, table in tables.items():
        want = expected_table(table, src, dst)
        assert loaded[key].shape == want.shape, key
        assert torch.allclose(loaded[key].double(), want, atol=1e-6), key
    for key, bias in biases.items():
        want = expected_bias(bias, src, dst)
        assert torch.allclose(loaded[key].double(), want, atol=1e-6), key
    for key, value in source.items():  # everything else as it was
        if not key.endswith((TABLE, BIAS)):
            assert torch.equal(loaded[key], value), key


@pytest.mark.parametrize('path', PATHS)
@pytest.mark.parametrize('src,dst', WINDOW_PAIRS)
def test_gqpe_biases_resized_and_gaussians_copied(path, src, dst, tmp_path):
    source = randomize_(_backbone('gqpe', src), seed=2).state_dict()
    loaded = load_across(path, source, 'gqpe', dst, tmp_path).state_dict()
    for key, value in source.items():
        if key.endswith(BIAS):
            want = expected_bias(value, src, dst)
            assert torch.allclose(loaded[key].double(), want, atol=1e-6), key
        else:  # the Gaussians do not depend on the window
            assert torch.equal(loaded[key], value), key


# ------------------------------------------- properties of any resize
def _ramp_table(window, groups):
    """Group 0: the vertical offset dy = ym - yn; group 1: the horizontal
    offset xm - xn; group 2: a constant; group 3: a peak at zero offset."""
    h, w = 2 * window[0] - 1, 2 * window[1] - 1
    dy = torch.arange(h, dtype=torch.float32) - (window[0] - 1)
    dx = torch.arange(w, dtype=torch.float32) - (window[1] - 1)
    grid = torch.zeros(h, w, groups)
    grid[..., 0] = dy[:, None].expand(h, w)
    grid[..., 1] = dx[None, :].expand(h, w)
    grid[..., 2] = 0.7
    grid[window[0] - 1, window[1] - 1, 3] = 1.0
    return grid.reshape(h * w, groups)


def _ramp_state(window):
    source = _backbone('lrpe', window)
    state = source.state_dict()
    for key in _positional(state, TABLE):
        state[key] = _ramp_table(window, state[key].shape[1])
    for key in _positional(state, BIAS):  # the query's row
        rows = torch.arange(window[0], dtype=torch.float32)
        state[key] = rows.repeat_interleave(window[1]).view(1, -1, 1)
    return state


@pytest.mark.parametrize('path', PATHS)
@pytest.mark.parametrize('src,dst', WINDOW_PAIRS)
def test_resized_ramps_keep_their_axis_and_direction(path, src, dst,
                                                     tmp_path):
    model = load_across(path, _ramp_state(src), 'lrpe', dst, tmp_path)
    wh, ww = dst
    ys, xs = torch.meshgrid(torch.arange(wh), torch.arange(ww), indexing='ij')
    ys, xs = ys.reshape(-1), xs.reshape(-1)
    dy = (ys[:, None] - ys[None, :]).reshape(-1)   # query row - key row
    dx = (xs[:, None] - xs[None, :]).reshape(-1)
    for level in model.levels:
        pos = level.encoder[0].gate_unit.pos
        # the mixing weights P_s[m, n] of the whole window, read through the
        # published index (tests/reference.py), not the model's own, laid
        # out by offset: rows dy = ym - yn, columns dx = xm - xn
        weights = lrpe_weights(pos, ys, xs).detach()
        by_offset = torch.zeros(weights.shape[0], 2 * wh - 1, 2 * ww - 1)
        by_offset[:, dy + wh - 1, dx + ww - 1] = weights.reshape(
            weights.shape[0], -1)
        rows, cols = by_offset[0], by_offset[1].t()
        for ramp in (rows, cols):  # the other axis does not matter ...
            assert torch.allclose(ramp, ramp[:, :1].expand_as(ramp),
                                  atol=1e-6)
            # ... and it keeps increasing along its own axis
            assert (ramp[1:, 0] > ramp[:-1, 0]).all(), ramp[:, 0]
        assert torch.allclose(weights[2], torch.full_like(weights[2], 0.7),
                              atol=1e-6)
        # a query's weight on itself is the zero-offset entry: kept
        peak = by_offset[3]
        assert peak[wh - 1, ww - 1] == peak.max()
        assert torch.allclose(weights[3].diagonal(), torch.ones(wh * ww),
                              atol=1e-6)
        bias = pos.token_proj_n_bias.detach().view(wh, ww)
        assert torch.allclose(bias, bias[:, :1].expand(wh, ww), atol=1e-6)
        assert (bias[1:, 0] > bias[:-1, 0]).all()


# ------------------------------------ everything the report lists is loaded
@pytest.mark.parametrize('gate', ['gqpe', 'lrpe'])
@pytest.mark.parametrize('window', [7, 5])
def test_every_resized_tensor_of_a_released_checkpoint_is_loaded(gate,
                                                                 window):
    """The load report lists each resized tensor; each of them must hold the
    resized checkpoint values, not the model's initialization."""
    file = fixture_path(f'tiny_{gate}_official.pth')
    released = read_checkpoint(file)['state_dict_ema']
    model = PosMLP(fixture_arch(gate), gate=gate, window_size=window,
                   out_norm=False)
    init = {k: v.clone() for k, v in model.state_dict().items()}
    report = load_pretrained(model, file)
    loaded = model.state_dict()
    reported = {key: (before, after) for key, before, after in report.resized}
    changed = 0
    for key, value in released.items():
        if not key.endswith((TABLE, BIAS)):
            continue
        level = int(key.split('.')[1])
        src = fixture_arch(gate)['window_size'][level]
        src, dst = (src, src), (window, window)
        if src == dst:
            assert key not in reported
            assert torch.equal(loaded[key], value), key
            continue
        assert reported.get(key) == (tuple(value.shape),
                                     tuple(loaded[key].shape)), key
        assert key in report.loaded, key
        want = expected_table(value, src, dst) if key.endswith(TABLE) \
            else expected_bias(value, src, dst)
        assert torch.allclose(loaded[key].double(), want, atol=1e-6), key
        assert not torch.allclose(loaded[key], init[key]), key
        changed += 1
    assert changed == len(reported) > 0


# ------------------------------------ the loaded model computes the right thing
@pytest.mark.parametrize('gate', ['gqpe', 'lrpe'])
@pytest.mark.parametrize('src,dst', WINDOW_PAIRS)
def test_model_loaded_after_use_computes_the_reference(gate, src, dst):
    """Load into a model that has already run in eval mode (its mixing
    matrices cached), then compare its forward with the per-window reference
    on the loaded parameters."""
    model = _backbone(gate, dst).eval()
    x = torch.randn(1, 3, 45, 61)
    with torch.no_grad():
        before = model.forward_intermediates(
            x, output_fmt='NHWC', intermediates_only=True)
        source = randomize_(_backbone(gate, src), seed=3).state_dict()
        model.load_state_dict(source)
        ours = model.forward_intermediates(
            x, output_fmt='NHWC', intermediates_only=True)
        ref = per_window_forward_levels(model, x)
    for level, (a, b) in enumerate(zip(ours, ref)):
        err = (a - b).abs().max().item()
        assert err <= 1e-5, f'level {level}: max error {err:.3g}'
    assert not torch.allclose(before[0], ours[0])


@pytest.mark.parametrize('gate', ['gqpe', 'lrpe'])
def test_rectangular_window_state_dict_loads_into_its_own_window(gate):
    """A state dict of a model with rectangular windows loads strictly into
    a model with the same windows, unchanged (a GQPE bias records only the
    number of positions, which a rectangle shares with no square)."""
    arch = dict(ARCH, window_size=((5, 6), (4, 3), (3, 2), (2, 2)))
    source = randomize_(PosMLP(arch, gate=gate), seed=5).state_dict()
    model = PosMLP(arch, gate=gate)
    model.load_state_dict(source)
    for key, value in model.state_dict().items():
        assert torch.equal(value, source[key]), key


# --------------------------------------------- the converter, another path
def test_converter_resizes_for_other_windows_as_documented(tmp_path):
    """tools/convert_checkpoint.py --window-size: the written tables and
    biases are the released ones resized by the documented convention."""
    tool = load_tool('convert_checkpoint')
    src = fixture_path('tiny_lrpe_official.pth')
    dst = str(tmp_path / 'w5.safetensors')
    assert tool.main([src, dst, '--window-size', '5']) == 0
    written = read_checkpoint(dst)
    released = read_checkpoint(src)['state_dict_ema']
    windows = fixture_arch('lrpe')['window_size']
    checked = 0
    for key, value in released.items():
        if key.endswith((TABLE, BIAS)):
            w = windows[int(key.split('.')[1])]
            want = expected_table(value, (w, w), (5, 5)) \
                if key.endswith(TABLE) else expected_bias(value, (w, w),
                                                           (5, 5))
            assert torch.allclose(written[key].double(), want, atol=1e-6), key
            checked += 1
    assert checked == 2 * sum(fixture_arch('lrpe')['depths'])
