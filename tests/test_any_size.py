"""Any input size: exact partial windows, and resizing of position tables."""
from __future__ import annotations

import logging

import pytest
import torch

from posmlp_dense import PosMLP, create_posmlp_classifier, load_pretrained
from posmlp_dense.gates import GateUnit
from posmlp_dense.relative_position import (infer_window, resize_position_bias,
                                            resize_relative_table)
from posmlp_dense import workspace as workspace_module
from posmlp_dense.windows import axis_segments, make_plan

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
        plan = make_plan(size, size, (window, window))
        assert plan.exact and len(plan.classes) == 1
    plan = make_plan(50, 84, (14, 14))
    assert not plan.exact
    assert sorted(c.key for c in plan.classes) == [(0, 8, 0, 14),
                                                   (0, 14, 0, 14)]


def test_axis_segments_cover_the_axis():
    for length in range(1, 40):
        for window in (1, 5, 7, 14):
            for origin in range(window):
                segs = axis_segments(length, window, origin)
                covered = sum(s.count * s.size for s in segs)
                assert covered == length
                assert all(0 < s.size and s.offset + s.size <= window
                           for s in segs)


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


# ------------------------------------------------------------------ caching
def _count_mixing_calls(monkeypatch):
    """Count the gates' computations of mixing matrices (GateUnit._augmented,
    with or without autograd)."""
    calls = []
    original = GateUnit._augmented

    def counted(self, *args, **kwargs):
        calls.append(1)
        return original(self, *args, **kwargs)
    monkeypatch.setattr(GateUnit, '_augmented', counted)
    return calls


def test_eval_mode_caches_mixing_until_parameters_change(monkeypatch):
    model = _model('gqpe')
    calls = _count_mixing_calls(monkeypatch)
    x = torch.randn(1, 3, 100, 150)
    with torch.no_grad():
        first = model(x)
        n_first = len(calls)
        assert n_first > 0
        second = model(x)
    assert len(calls) == n_first  # served from the cache
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    # an optimizer step changes parameters: matrices are recomputed
    model.train()
    loss = sum(o.mean() for o in model(x))
    loss.backward()
    torch.optim.SGD(model.parameters(), lr=1.0).step()
    model.eval()
    calls.clear()
    with torch.no_grad():
        third = model(x)
    assert len(calls) == n_first
    assert not torch.equal(third[0], first[0])
    # in-place edits of a parameter invalidate too
    calls.clear()
    with torch.no_grad():
        model.levels[0].encoder[0].gate_unit.pos.attention_centers.add_(0.5)
        model(x)
    # only the changed block recomputes, once per window class of its map
    assert len(calls) == len(make_plan(25, 38, (14, 14)).classes) == 4


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
    """Without autograd the GELU and gating run in place, through scratch
    buffers; with it, out of place. Both must compute the same thing."""
    _assert_inference_equals_autograd(_model(gate))


@pytest.mark.parametrize('strip_bytes', [1, 3000, 20000, 1 << 30])
@pytest.mark.parametrize('shape', [(2, 3, 113, 67), (1, 3, 64, 64),
                                   (1, 3, 5, 9), (3, 3, 2, 7), (1, 3, 1, 1)])
def test_stem_inference_path_is_exact(monkeypatch, strip_bytes, shape):
    """In inference the stem makes its stride-2 map in strips of rows
    (from one row to the whole map here, at odd and even heights) and
    normalizes and activates each conv output in place. It must compute what
    the plain module calls compute, up to the convs' rounding, and leave the
    caller's image alone."""
    import posmlp_dense.stem as stem_module
    monkeypatch.setattr(stem_module, 'STEM_STRIP_BYTES', strip_bytes)
    torch.manual_seed(0)
    model = _model('gqpe')
    stem = model.patch_embed
    for norm in stem.norms:  # eval BatchNorms with non-trivial statistics
        norm.running_mean.normal_()
        norm.running_var.uniform_(0.5, 2.0)
    x = torch.randn(*shape)
    original = x.clone()
    with torch.no_grad():
        fast = stem(x, in_place=True)
    with torch.enable_grad():
        plain = stem(x.clone().requires_grad_()).detach()
    assert torch.equal(x, original)
    assert fast.shape == (shape[0], *stem.output_size(*shape[2:]),
                          stem.projs[2].out_channels)
    torch.testing.assert_close(fast, plain, rtol=1e-5, atol=1e-5)


def test_stem_without_running_statistics_normalizes_the_whole_map(
        monkeypatch):
    """A BatchNorm without running statistics normalizes with the batch's:
    per strip they would differ, so such a stem makes the map whole."""
    import posmlp_dense.stem as stem_module
    monkeypatch.setattr(stem_module, 'STEM_STRIP_BYTES', 1)
    torch.manual_seed(0)
    stem = _model('gqpe').patch_embed
    stem.norms[1] = torch.nn.BatchNorm2d(
        stem.norms[1].num_features, eps=1e-6, track_running_stats=False)
    x = torch.randn(1, 3, 40, 24)
    with torch.no_grad():
        fast = stem(x, in_place=True)
        plain = stem(x)
    torch.testing.assert_close(fast, plain, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('max_rows', [None, 1, 7, 300])
def test_runs_cover_the_token_buffer_in_order(max_rows):
    for (h, w), shift in [((17, 29), (0, 0)), ((40, 33), (0, 0)),
                          ((23, 31), (3, 2))]:
        plan = make_plan(h, w, (7, 7), shift)
        runs = plan.runs(2, max_rows)
        start = 0
        for run in runs:
            assert run.start == start and run.windows >= 1
            assert run.rows <= max(max_rows or run.rows, run.n)
            start += run.rows
        assert start == plan.num_tokens(2)
        # every window of every class, in class order
        per_class = {}
        for run in runs:
            per_class[run.key] = per_class.get(run.key, 0) + run.windows
        assert list(per_class) == [c.key for c in plan.classes]
        assert list(per_class.values()) == [2 * c.windows_per_sample
                                            for c in plan.classes]


@pytest.mark.parametrize('max_rows', [None, 1, 150])
@pytest.mark.parametrize('gate', ['gqpe', 'sgu'])
def test_inference_in_runs_equals_autograd_path(monkeypatch, gate, max_rows):
    """CPU inference works through each level in runs of windows (one
    window per run with max_rows=1; whole classes with None, as on GPUs);
    the run length must not change the result."""
    monkeypatch.setattr(workspace_module, 'CPU_RUN_ROWS', max_rows)
    _assert_inference_equals_autograd(_model(gate))
