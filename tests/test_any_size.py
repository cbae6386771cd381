"""Any input size: exact partial windows, and resizing of position tables."""
from __future__ import annotations

import logging

import pytest
import torch

from posmlp_dense import PosMLP, create_posmlp_classifier, load_pretrained
from posmlp_dense.relative_position import (infer_window, resize_position_bias,
                                            resize_relative_table)
from posmlp_dense.windows import window_grid

from conftest import TINY_ARCH, fixture_arch, fixture_path, randomize_
from reference import padded_masked_level, per_window_forward_levels

# odd, prime, rectangular; maps of 1x1 and maps smaller than a window
SIZES = [(17, 29), (33, 47), (97, 161), (224, 225), (511, 511)]


def _model(gate, **kwargs):
    model = PosMLP(TINY_ARCH, gate=gate, out_norm=False, **kwargs)
    return randomize_(model).eval()


def _assert_exact(model, size, tol=1e-5):
    x = torch.randn(1, 3, *size)
    with torch.no_grad():
        ours = model.forward_intermediates(x, output_fmt='NHWC',
            intermediates_only=True)
        ref = per_window_forward_levels(model, x)
    for level, (a, b) in enumerate(zip(ours, ref)):
        assert a.shape == b.shape
        err = (a - b).abs().max().item()
        assert err <= tol, f'level {level} at {size}: max error {err:.3g}'


@pytest.mark.parametrize('gate', ['gqpe', 'lrpe'])
@pytest.mark.parametrize('size', SIZES)
def test_partial_windows_equal_per_window_reference(gate, size):
    _assert_exact(_model(gate), size)


@pytest.mark.parametrize('gate', ['gqpe', 'lrpe'])
def test_detection_size_equals_per_window_reference(gate):
    arch = dict(TINY_ARCH, embed_dims=(8, 16, 32, 64), depths=(1, 1, 1, 1))
    model = randomize_(PosMLP(arch, gate=gate, out_norm=False)).eval()
    _assert_exact(model, (800, 1333))


@pytest.mark.parametrize('gate', ['sgu', 'lrpe_full'])
def test_other_gates_equal_per_window_reference(gate):
    if gate == 'lrpe_full':
        model = _model('lrpe', pos_only=False)
    else:
        model = _model(gate)
    _assert_exact(model, (97, 161))


def test_rectangular_and_per_level_windows():
    model = _model('gqpe', window_size=[(5, 3), (4, 7), 6, (2, 3)])
    assert [lvl.window for lvl in model.levels] == [(5, 3), (4, 7), (6, 6),
                                                    (2, 3)]
    _assert_exact(model, (97, 161))


@pytest.mark.parametrize('gate', ['gqpe', 'lrpe'])
def test_shifted_windows_equal_per_window_reference(gate):
    arch = dict(TINY_ARCH, depths=(2, 2, 2, 2), window_size=(7, 7, 7, 7))
    model = randomize_(PosMLP(arch, gate=gate, shift=True, out_norm=False))
    _assert_exact(model.eval(), (97, 161))


def test_published_sizes_need_no_partial_windows():
    for size, window in ((56, 14), (28, 14), (14, 14), (7, 7)):
        grid = window_grid(size, size, (window, window))
        assert grid.padding() == (0, 0, 0, 0)
    grid = window_grid(50, 84, (14, 14))
    assert grid.padding() == (0, 0, 0, 6) and (grid.rows, grid.cols) == (4, 6)


def test_window_spans_cover_the_axis():
    for length in range(1, 40):
        for window in (1, 5, 7, 14):
            for origin in range(window):
                grid = window_grid(length, 3, (window, 3), (origin, 0))
                spans = grid.spans(0)
                assert spans[0][0] == 0 and spans[-1][1] == length - 1
                assert all(b[0] == a[1] + 1 for a, b in zip(spans, spans[1:]))
                assert all(0 <= last - first < window for first, last in spans)
                if origin:  # the leading window holds the first tokens
                    assert spans[0][1] == min(origin, length) - 1


@pytest.mark.parametrize('gathers', [False, True], ids=['views', 'gathers'])
@pytest.mark.parametrize('size,window,origin', [
    ((17, 29), (7, 7), (0, 0)), ((14, 28), (14, 14), (0, 0)),
    ((5, 3), (14, 14), (0, 0)), ((23, 31), (7, 5), (3, 2))])
def test_window_layout_round_trip_and_key_mask(size, window, origin,
                                               gathers):
    """to_windows puts each window's tokens in one row of N, zero-padded,
    group by group; to_map brings them back to map order; key_mask marks the
    real ones.
    Views (eager) and gathers (captured graphs) give the same layout, bit
    for bit."""
    grid = window_grid(*size, window, origin, gathers=gathers)
    groups, per_group, batch = 3, 2, 2
    t = torch.randn(groups * per_group, batch, *size)
    rows = grid.to_windows(t, groups)
    n_windows = grid.rows * grid.cols
    assert rows.shape == (groups, per_group * batch * n_windows,
                          window[0] * window[1])
    # to_map keeps the channels grouped: channel c * groups + g at [g, c]
    grouped = t.view(per_group, groups, batch, -1).transpose(0, 1).reshape(
        groups, per_group * batch, -1)
    assert torch.equal(grid.to_map(rows).view_as(grouped), grouped)
    mask = grid.key_mask(t).view(n_windows, -1)
    assert mask.shape == (n_windows, window[0] * window[1])
    assert int(mask.sum()) == size[0] * size[1]
    padded = rows.view(groups, per_group, batch, n_windows, -1)
    assert (padded * (1 - mask)).abs().sum() == 0
    # channel k is in group k % groups (the published order)
    k = 4
    first_window = rows.view(groups, per_group, batch, n_windows, -1)[
        k % groups, k // groups, 0, 0]
    top, left = grid.top, grid.left
    wh, ww = window
    expected = torch.zeros(wh, ww)
    h = min(wh - top, size[0])
    w = min(ww - left, size[1])
    expected[top:top + h, left:left + w] = t[k, 0, :h, :w]
    assert torch.equal(first_window, expected.view(-1))
    other = window_grid(*size, window, origin, gathers=not gathers)
    assert torch.equal(other.to_windows(t, groups), rows)
    assert torch.equal(other.to_map(rows).view_as(grouped), grouped)
    in_window = grid.in_window_index_on_map(t.device)
    assert torch.equal(in_window, grid.map_index(t.device) % (wh * ww))
    assert torch.equal(other.in_window_index_on_map(t.device), in_window)


def test_kept_window_layout_is_reused_only_where_nothing_records():
    """Eager PyTorch writes the real tokens into a zeroed layout that the
    grid keeps for the next call of the same slot: the padded tokens stay
    zero, each call equals a fresh layout, and only the slot's last result
    is overwritten. Where autograd records, every call gets its own."""
    grid = window_grid(17, 29, (7, 7), (3, 2))
    first, second = torch.randn(2, 6, 2, 17, 29).unbind(0)
    with torch.no_grad():
        a = grid.to_windows(first, 3, slot='input')
        expected_a = grid.to_windows(first, 3)
        assert torch.equal(a, expected_a)
        b = grid.to_windows(second, 3, slot='input')
        assert b.data_ptr() == a.data_ptr()
        assert torch.equal(b, grid.to_windows(second, 3))
        other = grid.to_windows(first, 3, slot='gradient')
        assert torch.equal(other, expected_a) and torch.equal(
            b, grid.to_windows(second, 3))
    c = grid.to_windows(first, 3, slot='input')
    assert c.data_ptr() != b.data_ptr() and torch.equal(c, expected_a)
    grid.release_layouts()
    with torch.no_grad():
        assert torch.equal(grid.to_windows(second, 3, slot='input'),
                           grid.to_windows(second, 3))


@pytest.mark.parametrize('gate', ['gqpe', 'lrpe'])
def test_equals_padding_with_masked_keys(gate):
    """Our partial windows compute exactly what padding every level to whole
    windows with garbage and masking the padded keys computes."""
    model = _model(gate)
    x = torch.randn(1, 3, 61, 83)
    with torch.no_grad():
        ours = model.forward_intermediates(x, output_fmt='NHWC',
            intermediates_only=True)
        feed = model.patch_embed(x).permute(0, 3, 1, 2)
        for level, mine in zip(model.levels, ours):
            ref = padded_masked_level(level, feed)
            assert (mine - ref).abs().max() <= 1e-4
            feed = mine.permute(0, 3, 1, 2)


# ---------------------------------------------------------------- resizing
def test_resize_keeps_constants_shapes_and_orientation():
    table = torch.full((13 * 13, 4), 0.7)
    out = resize_relative_table(table, (7, 7), (14, 14))
    assert out.shape == (27 * 27, 4)
    assert torch.allclose(out, torch.full_like(out, 0.7), atol=1e-6)
    # a table that varies only along the vertical offset keeps doing so
    dy = torch.arange(13.0).repeat_interleave(13).unsqueeze(1)
    out = resize_relative_table(dy, (7, 7), (14, 14)).view(27, 27)
    assert torch.allclose(out, out[:, :1].expand(27, 27), atol=1e-5)
    assert (out[1:, 0] > out[:-1, 0]).all()
    # rectangular: rows stay the vertical axis
    rect = resize_relative_table(dy, (7, 7), (4, 9)).view(7, 17)
    assert torch.allclose(rect, rect[:, :1].expand(7, 17), atol=1e-5)
    bias = torch.randn(1, 49, 1)
    assert resize_position_bias(bias, (7, 7), (7, 7)) is bias
    assert resize_position_bias(bias, (7, 7), (3, 5)).shape == (1, 15, 1)


def test_infer_window_from_shapes():
    assert infer_window(196) == (14, 14)
    assert infer_window(15, 9 * 5, prefer=(3, 5)) == (3, 5)
    assert infer_window(15, 9 * 5, prefer=(5, 3)) == (5, 3)
    with pytest.raises(ValueError):
        infer_window(15)


@pytest.mark.parametrize('gate', ['gqpe', 'lrpe'])
@pytest.mark.parametrize('src,dst', [(14, 7), (7, 14)])
def test_checkpoint_of_another_window_is_resized_on_load(gate, src, dst,
                                                         caplog):
    source = randomize_(PosMLP(TINY_ARCH, gate=gate, window_size=src))
    target = PosMLP(TINY_ARCH, gate=gate, window_size=dst)
    with caplog.at_level(logging.INFO, logger='posmlp_dense'):
        target.load_state_dict(source.state_dict())
    key = 'levels.0.encoder.0.gate_unit.pos.token_proj_n_bias'
    lines = [r.getMessage() for r in caplog.records if 'resized' in
             r.getMessage() and key in r.getMessage()]
    assert len(lines) == 1 and f'window {src}x{src}' in lines[0]
    src_state, dst_state = source.state_dict(), target.state_dict()
    assert dst_state[key].shape == (1, dst * dst, 1)
    assert torch.equal(dst_state[key], resize_position_bias(
        src_state[key], (src, src), (dst, dst)))
    if gate == 'lrpe':
        tkey = key.replace('token_proj_n_bias',
                           'window_relative_position_bias_table')
        assert torch.equal(dst_state[tkey], resize_relative_table(
            src_state[tkey], (src, src), (dst, dst)))
    else:  # size-free parameters are copied as they are
        ckey = key.replace('token_proj_n_bias', 'attention_spreads')
        assert torch.equal(dst_state[ckey], src_state[ckey])
    with torch.no_grad():
        outs = target.eval()(torch.randn(1, 3, 75, 90))
    assert all(torch.isfinite(o).all() for o in outs)


@pytest.mark.parametrize('gate', ['gqpe', 'lrpe'])
def test_same_window_loading_is_bit_identical(gate):
    model = create_posmlp_classifier(fixture_arch(gate), gate=gate,
                                     num_classes=10)
    load_pretrained(model, fixture_path(f'tiny_{gate}_official.pth'))
    clone = create_posmlp_classifier(fixture_arch(gate), gate=gate,
                                     num_classes=10)
    clone.load_state_dict(model.state_dict())
    for key, value in model.state_dict().items():
        assert torch.equal(value, clone.state_dict()[key]), key


def test_released_checkpoint_loads_into_other_windows():
    model = PosMLP(fixture_arch('lrpe'), gate='lrpe', window_size=(7, 7, 7, 7))
    report = load_pretrained(model, fixture_path('tiny_lrpe_official.pth'))
    assert len(report.resized) == 2 * 4  # table + bias, levels 0-2 (4 blocks)
    assert report.missing == [] or all(k.startswith('norm')
                                       for k in report.missing)


# ----------------------------------------------- one computation per level
def test_mixing_weights_are_computed_once_per_level(monkeypatch):
    """A level computes all its blocks' mixing weights in one stacked call,
    in every mode."""
    from posmlp_dense.gates import PoSGU
    calls = []
    original = PoSGU.stacked_weights.__func__

    def counted(cls, gates, captured=False):
        calls.append(len(gates))
        return original(cls, gates, captured)
    monkeypatch.setattr(PoSGU, 'stacked_weights', classmethod(counted))
    model = _model('gqpe')
    x = torch.randn(1, 3, 100, 150)
    with torch.no_grad():
        model(x)
    assert calls == list(TINY_ARCH['depths'])
    calls.clear()
    sum(o.sum() for o in model.train()(x)).backward()
    assert calls == list(TINY_ARCH['depths'])


def test_gradients_flow_in_eval_mode_with_grad_enabled():
    """ERF-style use: eval mode, grads on: no cached (detached) matrices."""
    model = _model('gqpe')
    with torch.no_grad():
        model(torch.randn(1, 3, 64, 64))  # fills the cache
    out = model(torch.randn(1, 3, 64, 64))[0].sum()
    out.backward()
    pos = model.levels[0].encoder[0].gate_unit.pos
    assert pos.attention_centers.grad is not None


def _assert_inference_equals_autograd(model):
    x = torch.randn(2, 3, 97, 161)
    with torch.no_grad():
        fast = model.forward_intermediates(x, output_fmt='NHWC',
            intermediates_only=True)
    with torch.enable_grad():
        plain = model.forward_intermediates(
            x.requires_grad_(), output_fmt='NHWC', intermediates_only=True)
    for a, b in zip(fast, plain):
        assert (a - b.detach()).abs().max() <= 1e-5


@pytest.mark.parametrize('gate', ['gqpe', 'lrpe', 'sgu'])
def test_inference_path_equals_autograd_path(gate):
    """Without autograd the blocks run block_pass directly; with it, through
    the lean training Function (or autograd through each operation). Both
    must compute the same thing."""
    _assert_inference_equals_autograd(_model(gate))
