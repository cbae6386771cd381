"""The forward's mode is decided once (forward_mode.py) and behaves as named;
forward_intermediates is the one forward loop."""
from __future__ import annotations

import pytest
import torch

from posmlp_dense import PosMLP
from posmlp_dense.forward_mode import ForwardMode, decide_forward_mode

from conftest import TINY_ARCH, randomize_


def _model(**kwargs) -> PosMLP:
    return randomize_(PosMLP(TINY_ARCH, **kwargs))


def test_mode_follows_grad_mode_and_graph_capture():
    x = torch.randn(1, 3, 32, 32)
    assert decide_forward_mode(x) == ForwardMode(autograd=True, graph=False)
    with torch.no_grad():
        assert decide_forward_mode(x) == ForwardMode(autograd=False,
                                                     graph=False)
    seen = []

    def capture(t):
        seen.append(decide_forward_mode(t))
        return t + 1
    torch.compile(capture, backend='eager', fullgraph=True)(x)
    assert seen == [ForwardMode(autograd=True, graph=True)]


def test_lean_function_runs_exactly_when_autograd_records(monkeypatch):
    """Blocks take the lean training Function whenever grad mode is on (the
    mode's ``autograd``) and the gate declares ``lean_backward``, in train
    or eval mode alike; never under no_grad, and never for SGU."""
    from posmlp_dense.block_function import LeanBlock
    calls = []
    forward = LeanBlock.forward

    def counting(ctx, *args):
        calls.append(1)
        return forward(ctx, *args)
    monkeypatch.setattr(LeanBlock, 'forward', staticmethod(counting))
    x = torch.randn(1, 3, 64, 64)
    blocks = sum(TINY_ARCH['depths'])
    for gate, lean in (('gqpe', True), ('lrpe', True), ('sgu', False)):
        model = _model(gate=gate)
        for training in (True, False):
            model.train(training)
            calls.clear()
            model(x)
            assert len(calls) == (blocks if lean else 0), (gate, training)
            calls.clear()
            with torch.no_grad():
                model(x)
            assert not calls


def test_train_mode_under_no_grad_applies_stochastic_depth():
    """Stochastic depth follows self.training whatever the grad mode: two
    train-mode forwards under no_grad draw different block drops, and they
    equal the autograd path's forward with the same random draws."""
    model = _model(drop_path_rate=0.5).train()
    for module in model.modules():  # keep BN statistics out of the picture
        if isinstance(module, torch.nn.BatchNorm2d):
            module.eval()
    x = torch.randn(4, 3, 64, 64)
    with torch.no_grad():
        torch.manual_seed(1)
        first = model(x)
        torch.manual_seed(2)
        second = model(x)
        torch.manual_seed(1)
        again = model(x)
    assert any(not torch.equal(a, b) for a, b in zip(first, second))
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    torch.manual_seed(1)
    with_grad = model(x)
    # the same up to rounding: under no_grad the stem's convs run
    # channels-last, with grad NCHW (stem.py), and their last bits differ
    for a, b in zip(first, with_grad):
        torch.testing.assert_close(a, b.detach(), rtol=1e-6, atol=1e-6)
    model.eval()
    with torch.no_grad():
        evaluated = model(x)
    assert any(not torch.allclose(a, b) for a, b in zip(first, evaluated))


def test_forward_intermediates_semantics():
    model = _model(out_indices=(0, 1, 2, 3)).eval()
    x = torch.randn(1, 3, 64, 96)
    calls = []
    for i, level in enumerate(model.levels):
        level.register_forward_hook(lambda *_, i=i: calls.append(i))
    with torch.no_grad():
        full = model.forward_intermediates(x, intermediates_only=True)
        calls.clear()
        early = model.forward_intermediates(x, indices=[1], stop_early=True,
                                            intermediates_only=True)
        assert calls == [0, 1]  # levels 2 and 3 were not run
        last_two = model.forward_intermediates(x, indices=2,
                                               intermediates_only=True)
        final, normed = model.forward_intermediates(x, indices=[-1],
                                                    norm=True)
        nhwc = model.forward_intermediates(x, indices=[0],
                                           output_fmt='NHWC',
                                           intermediates_only=True)
    assert len(full) == 4
    assert torch.equal(early[0], full[1])
    assert all(torch.equal(a, b) for a, b in zip(last_two, full[2:]))
    assert torch.equal(final, full[3])
    expected = model.norm3(full[3].permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
    torch.testing.assert_close(normed[0], expected)
    assert torch.equal(nhwc[0], full[0].permute(0, 2, 3, 1))
    # the backbone's forward is the normalized out_indices levels
    outs = model(x)
    torch.testing.assert_close(outs[3], expected)
    for bad in ([4], [-5], 5, 0):
        with pytest.raises(Exception, match='out of range|range'):
            model.forward_intermediates(x, indices=bad)
    with pytest.raises(ValueError, match='output_fmt'):
        model.forward_intermediates(x, output_fmt='NCWH')


def test_levels_keep_one_channels_last_layout():
    """Every level takes and returns (B, H, W, C) maps."""
    model = _model().eval()
    x = torch.randn(1, 3, 64, 96)
    with torch.no_grad():
        y = model.patch_embed(x)
        assert y.shape == (1, 16, 24, TINY_ARCH['embed_dims'][0])
        for level, dim in zip(model.levels, TINY_ARCH['embed_dims']):
            y = level(y)
            assert y.dim() == 4 and y.shape[-1] == dim


def test_inference_frees_the_pre_activation_before_the_mixing(monkeypatch):
    """Without autograd a block keeps no intermediate it has used: the
    pre-activation (2K values per token) is gone by the time u is mixed,
    which lowers an inference's peak memory. Where the lean training
    Function runs, the pass keeps it (the Function saves it)."""
    import weakref
    from posmlp_dense import block_pass as module
    seen = {}
    gelu, mix = module.F.gelu, module.mix

    def recording_gelu(hidden, **kwargs):
        seen['hidden'] = weakref.ref(hidden)
        return gelu(hidden, **kwargs)

    def checking_mix(*args):
        seen.setdefault('alive', []).append(seen['hidden']() is not None)
        return mix(*args)
    monkeypatch.setattr(module.F, 'gelu', recording_gelu)
    monkeypatch.setattr(module, 'mix', checking_mix)
    model = _model().eval()
    x = torch.randn(1, 3, 64, 80)
    with torch.no_grad():
        model(x)
    assert seen['alive'] and not any(seen['alive'])
    seen.clear()
    sum(o.sum() for o in model(x)).backward()
    assert seen['alive'] and all(seen['alive'])
