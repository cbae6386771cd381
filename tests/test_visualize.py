"""tools/visualize_posmap.py and posmlp_dense/analysis/posmap.py.

* the tool runs on every gate type and every checkpoint format;
* what it draws is the model's own mixing matrix (from the module, not
  re-derived), for the full window, a partial window and a resized window;
* the group summaries put each GQPE group where its map peaks;
* the ERF of a token at a level-1 window's centre is exactly zero beyond
  the reach the architecture allows, and that reach is attained.
"""
from __future__ import annotations

import math
import os

import numpy as np
import pytest
import torch

from posmlp_dense import PosMLP, load_pretrained, save_checkpoint
from posmlp_dense.analysis import posmap as pm

from conftest import fixture_path, load_tool, randomize_

ARCH = dict(embed_dims=(16, 32, 64, 128), depths=(1, 1, 1, 1),
            mlp_ratio=(4, 4, 4, 2), gamma=(4, 8, 16, 32),
            window_size=(7, 7, 7, 7))


def _tool():
    return load_tool('visualize_posmap')


vp = _tool()


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    vp._close_all()


def _model(gate='gqpe', **kwargs):
    model = PosMLP(ARCH, gate=gate, out_norm=False, **kwargs)
    return randomize_(model).eval()


def _run(argv):
    return vp.run(vp.build_parser().parse_args(argv))


def _drawn(fig):
    """{group: array} of the heat-maps a figure draws (gid 'group{g}')."""
    out = {}
    for ax in fig.axes:
        for img in ax.images:
            gid = img.get_gid() or ''
            if gid.startswith('group'):
                out[int(gid[5:])] = np.ma.filled(
                    img.get_array().astype(np.float64), np.nan)
    return out


def _module_rows(gate, query, rect=None):
    """One query's rows of gate.mixing_matrices, laid out on the window."""
    wh, ww = gate.window
    rect = rect or (0, wh, 0, ww)
    r0, r1, c0, c1 = rect
    with torch.no_grad():
        mix, _ = gate.mixing_matrices(rect)
    row = (query[0] - r0) * (c1 - c0) + (query[1] - c0)
    out = np.full((mix.shape[0], wh, ww), np.nan)
    out[:, r0:r1, c0:c1] = mix[:, row].reshape(-1, r1 - r0, c1 - c0).numpy()
    return out


def _assert_drawn_equals(fig, expected):
    drawn = _drawn(fig)
    assert sorted(drawn) == list(range(expected.shape[0]))
    for g, arr in drawn.items():
        np.testing.assert_array_equal(np.isnan(arr), np.isnan(expected[g]))
        np.testing.assert_allclose(np.nan_to_num(arr),
                                   np.nan_to_num(expected[g]), rtol=1e-6,
                                   atol=1e-7)


# ------------------------------------------------- drawn = module's matrix
@pytest.mark.parametrize('gate', ['gqpe', 'lrpe', 'sgu', 'lrpe_full'])
def test_drawn_weights_are_the_modules_mixing_matrix(gate):
    if gate == 'lrpe_full':
        model = _model('lrpe', pos_only=False)
    else:
        model = _model(gate)
    info = vp.posmap_figures(model, 1, 0, (2, 5), None, None, None)
    unit = model.levels[1].encoder[0].gate_unit
    _assert_drawn_equals(info['fig_posmap'], _module_rows(unit, (2, 5)))
    # a partial window (as at a map's bottom-right border)
    rect = (0, 4, 1, 6)
    info = vp.posmap_figures(model, 1, 0, (2, 5), rect, 'none', None)
    expected = _module_rows(unit, (2, 5), rect)
    _assert_drawn_equals(info['fig_posmap'], expected)
    if gate == 'gqpe':  # softmax over the real keys only: rows sum to one
        assert np.allclose(np.nansum(expected, axis=(1, 2)), 1.0)
    assert np.isnan(expected[:, 4:]).all()
    assert np.isnan(expected[:, :, 0]).all()


@pytest.mark.parametrize('gate', ['gqpe', 'lrpe'])
def test_resized_maps_are_those_of_a_model_built_for_that_window(gate):
    model = _model(gate)
    info = vp.posmap_figures(model, 0, 0, (3, 3), None, '11', '0-3')
    # the same architecture with window 11 at level 0, original weights
    # loaded (the model's load hook resizes them)
    big = PosMLP(ARCH, gate=gate, out_norm=False,
                 window_size=pm.windows_with(model, 0, 11)).eval()
    big.load_state_dict(model.state_dict())
    unit = big.levels[0].encoder[0].gate_unit
    assert unit.window == (11, 11) == info['resized_maps'].window
    expected = _module_rows(unit, (5, 5))       # query scaled to (5, 5)
    drawn = _drawn(info['fig_resized'])
    small = _module_rows(model.levels[0].encoder[0].gate_unit, (3, 3))
    # the figure's images: first the trained window's, then the resized
    fig_images = [img for ax in info['fig_resized'].axes for img in ax.images
                  if (img.get_gid() or '').startswith('group')]
    assert len(fig_images) == 8
    for k, img in enumerate(fig_images):
        arr = np.ma.filled(img.get_array().astype(np.float64), np.nan)
        want = small[k % 4] if k < 4 else expected[k % 4]
        np.testing.assert_allclose(arr, want, rtol=1e-6, atol=1e-7)
    assert set(drawn) == {0, 1, 2, 3}
    if gate == 'gqpe':  # GQPE parameters are untouched by resizing
        assert torch.equal(unit.pos.attention_centers,
                           model.levels[0].encoder[0].gate_unit.pos
                           .attention_centers)


def test_sgu_cannot_be_resized_and_says_so():
    model = _model('sgu')
    info = vp.posmap_figures(model, 0, 0, None, None, None, None)
    assert 'resized_maps' not in info
    texts = [t.get_text() for f in info['fig_resized'].subfigs
             for ax in f.axes for t in ax.texts]
    assert any('cannot be resized' in t for t in texts)


# --------------------------------------------------- checkpoints and gates
def _write(model, tmp_path, fmt):
    state = model.state_dict()
    if fmt == 'converted_pth':
        path = str(tmp_path / 'backbone.pth')
        save_checkpoint(state, path)
    elif fmt == 'converted_safetensors':
        path = str(tmp_path / 'backbone.safetensors')
        save_checkpoint(state, path)
    elif fmt == 'mmdet':
        path = str(tmp_path / 'epoch_3.pth')
        weights = {f'backbone.{k}': v for k, v in state.items()}
        for i, dim in enumerate(ARCH['embed_dims']):   # out_norm=True keys
            weights[f'backbone.norm{i}.weight'] = torch.ones(dim)
            weights[f'backbone.norm{i}.bias'] = torch.zeros(dim)
        weights['neck.lateral_convs.0.conv.weight'] = torch.randn(8, 32, 1, 1)
        weights['bbox_head.retina_cls.weight'] = torch.randn(9, 8, 3, 3)
        torch.save(dict(meta=dict(epoch=3, iter=120, mmdet_version='3.3.0',
                                  dataset_meta=dict(classes=('a', 'b'))),
                        state_dict=weights,
                        message_hub=dict(log_scalars={}, runtime_info=dict(
                            epoch=3)),
                        optimizer=dict(state={}, param_groups=[dict(
                            lr=0.01)])), path)
    else:
        raise ValueError(fmt)
    return path


@pytest.mark.parametrize('gate', ['gqpe', 'lrpe', 'sgu'])
def test_tool_runs_on_each_gate(gate, tmp_path):
    model = _model(gate)
    path = _write(model, tmp_path, 'converted_pth')
    out = tmp_path / 'out'
    formats = ['png', 'svg'] if gate == 'gqpe' else ['png']
    result = _run([path, '--level', '2', '--block', '0', '--query', '1,6',
                   '--out', str(out), '--formats', ','.join(formats)])
    unit = model.levels[2].encoder[0].gate_unit
    _assert_drawn_equals(result['fig_posmap'], _module_rows(unit, (1, 6)))
    names = set(os.listdir(out))
    for stem in ['posmap_L2_B0', 'posmap_L2_B0_resized_14x14',
                 'summary_L0', 'summary_L3']:
        assert {f'{stem}.{f}' for f in formats} <= names, (stem, names)
    assert 'summary.json' in names
    assert all(os.path.getsize(out / n) > 1000 for n in names)


@pytest.mark.parametrize('fmt', ['published_gqpe', 'published_lrpe',
                                 'converted_pth', 'converted_safetensors',
                                 'mmdet'])
def test_tool_reads_each_checkpoint_format(fmt, tmp_path):
    if fmt.startswith('published'):
        path = fixture_path(f'tiny_{fmt.split("_")[1]}_official.pth')
    else:
        path = _write(_model('lrpe'), tmp_path, fmt)
    result = _run([path, '--level', '1', '--out', str(tmp_path / 'out'),
                   '--window', 'none', '--summary', 'level',
                   '--formats', 'png'])
    loaded = result['loaded']
    assert loaded.prefix == ('backbone.' if fmt == 'mmdet' else '')
    # an independent load of the same file
    model = PosMLP(**loaded.config, out_norm=False).eval()
    load_pretrained(model, path, strict=False)
    unit = model.levels[1].encoder[0].gate_unit
    query = pm.centre_query(unit.window)
    _assert_drawn_equals(result['fig_posmap'], _module_rows(unit, query))
    for name in ('posmap_L1_B0.png', 'summary_L1.png', 'summary.json'):
        assert os.path.isfile(tmp_path / 'out' / name)
    assert not os.path.exists(tmp_path / 'out' / 'summary_L0.png')


def test_clear_errors(tmp_path, capsys):
    path = _write(_model('gqpe'), tmp_path, 'converted_pth')
    out = str(tmp_path / 'out')
    cases = [
        (['--level', '4'], 'level 4 does not exist'),
        (['--level', '1', '--block', '1'], 'block 1 does not exist'),
        (['--query', '7,0'], 'outside the 7x7 window'),
        (['--query', '1,1', '--rect', '2,7,0,7'], 'not one of the real'),
        (['--groups', '2-9'], 'do not exist'),
        (['--no-posmap', '--erf-level', '5'], '--erf-level 5 does not exist'),
        (['--window', '0'], 'window sides'),
    ]
    for extra, message in cases:
        assert vp.main([path, '--out', out, '--formats', 'png'] + extra) == 2
        err = capsys.readouterr().err
        assert message in err, (extra, err)
    assert vp.main([str(tmp_path / 'missing.pth'), '--out', out]) == 2
    assert 'checkpoint not found' in capsys.readouterr().err


# ------------------------------------------------------------- summaries
def test_summary_centres_are_where_the_maps_peak():
    model = _model('gqpe')
    gate = model.levels[0].encoder[0].gate_unit
    with torch.no_grad():
        # (d1, d2) = mean of (dx right, dy UP); S = A A^T
        gate.pos.attention_centers.copy_(torch.tensor(
            [[2.0, 1.0], [-1.0, 2.0], [0.0, -3.0], [1.0, 1.0]]))
        rot = torch.tensor([[math.cos(0.5), -math.sin(0.5)],
                            [math.sin(0.5), math.cos(0.5)]])
        gate.pos.attention_spreads.copy_(torch.stack([
            torch.eye(2) * 1.5, torch.eye(2) * 1.5, torch.eye(2) * 1.5,
            rot @ torch.diag(torch.tensor([0.45, 0.8]))]))
    maps = pm.query_maps(gate, (3, 3))
    summ = pm.group_summaries(gate, maps)
    # key (y, x) in image coordinates = query + (-d2, d1)
    for g, peak in enumerate([(2, 5), (1, 2), (6, 3)]):
        assert summ[g].source == 'gaussian'
        cy, cx = summ[g].centre
        assert (round(cy) + 3, round(cx) + 3) == peak
        arr = maps.weights[g].numpy()
        assert np.unravel_index(np.argmax(arr), arr.shape) == peak
    # on a window large enough to hold the Gaussian, the drawn map's own
    # moments are the summary's centre and covariance
    big = pm.resized_gate(gate, 21)
    big_maps = pm.query_maps(big)
    centre, cov = pm.map_moments(big_maps)
    for g in range(4):
        np.testing.assert_allclose(centre[g].numpy(), summ[g].centre,
                                   atol=2e-3)
    np.testing.assert_allclose(cov[3].numpy(), np.array(summ[3].cov),
                               atol=2e-3)
    # the rotated group is elongated: spreads along its axes differ
    major, minor = summ[3].std_axes
    assert major > 1.5 * minor


def test_isotropic_gqpe_centre():
    model = randomize_(PosMLP(ARCH, gate='gqpe', gqpe_generalized=False,
                              out_norm=False)).eval()
    gate = model.levels[0].encoder[0].gate_unit
    with torch.no_grad():
        gate.pos.attention_centers.copy_(torch.tensor(
            [[1.0, 0.5], [0.0, 0.0], [-0.5, -1.0], [0.5, 0.5]]))
        gate.pos.attention_spreads.copy_(torch.tensor([1.5, 1.0, 2.0, 1.0]))
    summ = pm.group_summaries(gate)
    # score = sigma^2 (d1 dx + d2 dy) - |v|^2 / 2: mean sigma^2 * delta
    assert summ[0].centre == pytest.approx((-1.125, 2.25))
    assert summ[2].centre == pytest.approx((4.0, -2.0))
    assert summ[0].std_axes == pytest.approx((1.0, 1.0))


# -------------------------------------------------- effective receptive field
def test_level_output_is_forward_intermediates():
    model = _model('lrpe')
    x = torch.randn(1, 3, 45, 61)
    with torch.no_grad():
        full = model.forward_intermediates(x, output_fmt='NHWC',
            intermediates_only=True)
        for level in range(4):
            assert torch.equal(pm.level_output(model, x, level), full[level])


@pytest.mark.parametrize('gate', ['gqpe', 'lrpe'])
def test_erf_at_level1_window_centre_is_zero_beyond_reach(gate):
    model = _model(gate)
    size = (224, 224)     # level 1: 28 x 28 tokens, 4 x 4 windows of 7
    assert pm.level_map_sizes(model, size)[1] == (28, 28)
    point = (10, 10)      # centre of level-1 window (1, 1): tokens 7..13
    # by hand: level-1 tokens 7..13 <- downsampling conv (3x3/2, pad 1)
    # level-0 tokens 13..27 <- level-0 windows 1..3 (7 tokens each): 7..27
    # <- stem conv 3x3/2: 13..55 <- stem conv 3x3/2: pixels 25..111
    reach = pm.theoretical_reach(model, 1, point, size)
    assert reach == ((25, 111), (25, 111))
    images = pm.normalize_images(pm.synthetic_images(2, size, seed=1))
    erf = pm.effective_receptive_field(model, images, level=1, point=point)
    grad = erf.grad
    (y0, y1), (x0, x1) = reach
    outside = torch.ones_like(grad, dtype=torch.bool)
    outside[y0:y1 + 1, x0:x1 + 1] = False
    assert torch.count_nonzero(grad[outside]) == 0
    assert grad[~outside].abs().max() > 0
    # the reach is attained: the gradient's support fills the rectangle
    assert pm.support_box(grad) == reach
    # and window borders cut it: the level-1 neighbour window's centre token
    # does not see this token's far pixels
    other = pm.effective_receptive_field(model, images, level=1,
                                         point=(17, 17))
    assert pm.theoretical_reach(model, 1, (17, 17), size) == (
        (81, 167), (81, 167))
    assert torch.count_nonzero(other.grad[:81]) == 0


def test_erf_reach_with_shifted_windows_and_odd_size():
    model = PosMLP(dict(ARCH, depths=(2, 2, 1, 1)), gate='lrpe',
                   out_norm=False, shift=True)
    model = randomize_(model).eval()
    size = (150, 203)
    point = pm.default_point(model, 1, size)
    reach = pm.theoretical_reach(model, 1, point, size)
    images = pm.normalize_images(pm.synthetic_images(1, size, seed=2))
    erf = pm.effective_receptive_field(model, images, level=1, point=point)
    assert pm.support_box(erf.grad) == reach
